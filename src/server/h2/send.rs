//! What an HTTP/2 stream sends: the interim answers that come before the final one,
//! the final head, its body as the client's flow control lets it go, its trailers —
//! or, for a WebSocket, the stream as the client side of a tunnel.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{header, HeaderValue, Response, StatusCode};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Guarded;
use crate::pipeline;
use crate::server::conn::ready_for_streams;

/// The pipeline's answer, with the interim answers (`103 Early Hints`) that came
/// before it sent as they come; `None` when the client reset the stream first (the
/// request is dropped, as an HTTP/1.1 request is when its client leaves).
pub(super) async fn answer(
    fut: pipeline::ResponseFuture<'_>,
    respond: &mut SendResponse<Bytes>,
) -> Option<pipeline::Answer> {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        let answer = fut.as_mut().poll(cx);
        // What the poll just relayed, before the final head; a stream the client (or
        // the `h2` crate, for a malformed body) reset meanwhile gets nothing more.
        let heads = crate::interim::take();
        if respond.poll_reset(cx).is_ready() {
            return Poll::Ready(None);
        }
        if let Some(heads) = heads {
            for (status, headers) in heads {
                crate::stats::count_status(status.as_u16());
                let mut head = Response::new(());
                *head.status_mut() = status;
                *head.headers_mut() = headers;
                if let Err(e) = respond.send_informational(head) {
                    tracing::debug!("sluice: an h2 interim answer was not sent: {e}");
                }
            }
        }
        answer.map(Some)
    })
    .await
}

/// Sends `resp` on the stream: its head (connection fields dropped, with `Date`, and
/// `Content-Length` when the body's length is known — a HEAD's too, as HTTP/1.1 gives
/// it), its body as the client's flow control lets it go, then its trailers; no body
/// after a HEAD, 204 or 304.
pub(super) async fn respond(
    respond: &mut SendResponse<Bytes>,
    resp: Response<Guarded>,
    head_only: bool,
) {
    let (mut parts, mut body) = resp.into_parts();
    let no_content =
        parts.status == StatusCode::NO_CONTENT || parts.status == StatusCode::NOT_MODIFIED;
    ready_for_streams(&mut parts.headers);
    let end = head_only || no_content || body.is_end_stream();
    if let (Some(n), false) = (body.size_hint().exact(), no_content || (end && !head_only)) {
        parts
            .headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(n));
    }
    let tx = match respond.send_response(Response::from_parts(parts, ()), end) {
        Ok(tx) => tx,
        Err(e) => {
            tracing::debug!("sluice: an h2 response head was not sent: {e}");
            respond.send_reset(Reason::INTERNAL_ERROR);
            return;
        }
    };
    if end {
        // Nothing of it is for the client: not a stream cut short.
        body.ended = true;
        return;
    }
    if let Err(why) = pipe(tx, &mut body).await {
        tracing::debug!("sluice: an h2 response was cut off: {why}");
    }
}

/// The body's frames onto the stream, each data frame once the stream has room for
/// some of it (the `h2` crate buffers the rest, up to the connection's send buffer).
async fn pipe(mut tx: SendStream<Bytes>, body: &mut Guarded) -> Result<(), h2::Error> {
    let mut body = Pin::new(body);
    loop {
        let frame = std::future::poll_fn(|cx| {
            if let Poll::Ready(e) = poll_reset(&mut tx, cx) {
                return Poll::Ready(Err(e));
            }
            body.as_mut().poll_frame(cx).map(Ok)
        })
        .await?;
        let frame = match frame {
            None => return tx.send_data(Bytes::new(), true),
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                // The backend's body broke off: the client must not take it as whole.
                tracing::debug!("sluice: an h2 response body failed: {e}");
                tx.send_reset(Reason::INTERNAL_ERROR);
                return Ok(());
            }
        };
        match frame.into_data() {
            Ok(data) => {
                let end = body.is_end_stream();
                if data.is_empty() && !end {
                    continue;
                }
                // A last frame goes without waiting: nothing is left to hold back, and
                // waiting kept the stream, its `limit` slot and its log line open for a
                // client whose window stays shut. The `h2` crate holds it until the
                // window opens, as it held any frame larger than the room that was found.
                if !end {
                    room(&mut tx, data.len()).await?;
                }
                tx.send_data(data, end)?;
                if end {
                    return Ok(());
                }
            }
            // Trailers end the body (DESIGN §18.5).
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return tx.send_trailers(trailers);
                }
            }
        }
    }
}

/// Waits until the stream has room for some of `len` bytes (at once when it has).
async fn room(tx: &mut SendStream<Bytes>, len: usize) -> Result<(), h2::Error> {
    if len == 0 {
        return Ok(());
    }
    std::future::poll_fn(|cx| poll_room(tx, len, cx))
        .await
        .map(drop)
}

/// Ready with the room the stream has (some of the `len` bytes asked for), or with why
/// it never will (the client reset it, or it closed).
fn poll_room(
    tx: &mut SendStream<Bytes>,
    len: usize,
    cx: &mut Context<'_>,
) -> Poll<Result<usize, h2::Error>> {
    tx.reserve_capacity(len);
    loop {
        match tx.capacity() {
            0 => {}
            room => return Poll::Ready(Ok(room)),
        }
        if let Poll::Ready(e) = poll_reset(tx, cx) {
            return Poll::Ready(Err(e));
        }
        match std::task::ready!(tx.poll_capacity(cx)) {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Poll::Ready(Err(e)),
            None => return Poll::Ready(Err(h2::Error::from(Reason::STREAM_CLOSED))),
        }
    }
}

/// Ready once the client reset the stream (or the connection failed), with why.
fn poll_reset(tx: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<h2::Error> {
    tx.poll_reset(cx)
        .map(|r| r.map_or_else(|e| e, h2::Error::from))
}

/// A WebSocket's stream: its `200` sent, then the stream joined to the backend's
/// connection until either side ends. The answer's line is written once the `200` is
/// sent (as the `101` an HTTP/1.1 client gets); the stream stays counted as open for
/// the connection's idle timeout while the tunnel lasts.
pub(super) async fn tunnel(
    respond: &mut SendResponse<Bytes>,
    resp: Response<Guarded>,
    recv: RecvStream,
    tunnel: Box<crate::tunnel::Tunnel>,
    client: std::net::SocketAddr,
) {
    let (mut parts, body) = resp.into_parts();
    ready_for_streams(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    let busy = body._stream.clone_open();
    let send = match respond.send_response(Response::from_parts(parts, ()), false) {
        Ok(send) => send,
        Err(e) => {
            tracing::debug!(client = %client, "sluice: h2 WebSocket stream ended before its tunnel opened: {e}");
            return;
        }
    };
    drop(body);
    let mut io = StreamIo {
        send,
        recv,
        unread: Bytes::new(),
    };
    tunnel.join(&mut io, Bytes::new()).await;
    drop(busy);
}

/// An HTTP/2 stream as a byte stream, for a tunnel: DATA in, DATA out, END_STREAM as
/// the end of writing.
struct StreamIo {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// What the last DATA frame had beyond the reader's buffer.
    unread: Bytes,
}

/// A stream's failure as the tunnel sees it: `STREAM_CLOSED` is a write past the
/// end; any other reason, a reset.
fn broken(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 stream failed"));
    }
    let kind = match e.reason() {
        Some(Reason::STREAM_CLOSED) => io::ErrorKind::BrokenPipe,
        _ => io::ErrorKind::ConnectionReset,
    };
    io::Error::new(kind, e)
}

/// Whether a reset only ends the stream (`NO_ERROR`, `CANCEL`: the client closed its
/// WebSocket's stream), which a reader takes as the end.
fn just_ended(e: &h2::Error) -> bool {
    matches!(e.reason(), Some(Reason::NO_ERROR | Reason::CANCEL))
}

impl AsyncRead for StreamIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.unread.is_empty() {
            match this.recv.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                // The client ended its side: the tunnel reads its end.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) if just_ended(&e) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(broken(e))),
                Poll::Ready(Some(Ok(d))) => {
                    let _ = this.recv.flow_control().release_capacity(d.len());
                    this.unread = d;
                }
            }
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for StreamIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let send = &mut self.send;
        let room = std::task::ready!(poll_room(send, buf.len(), cx)).map_err(broken)?;
        let n = room.min(buf.len());
        send.send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(broken)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection writes what the stream queued.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // END_STREAM; a stream the client reset has nothing to end.
        if let Poll::Ready(e) = poll_reset(&mut self.send, cx) {
            return Poll::Ready(if just_ended(&e) {
                Ok(())
            } else {
                Err(broken(e))
            });
        }
        Poll::Ready(self.send.send_data(Bytes::new(), true).map_err(broken))
    }
}
