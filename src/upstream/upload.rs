//! A request body on its way to a backend, with the backend heard while it goes: one
//! poll loop reads before each write, so a backend that answers before the upload ends
//! (a 413, a redirect) and stops reading is heard at once instead of when a write
//! fails. The same loop serves every transport: a TLS session cannot be read and
//! written from two futures at once, and a socket does not need to be.
//!
//! The body is never copied: each data frame is written from its own buffer, with the
//! chunk-size line and the line end beside it in one vectored write.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::outgoing::{Outgoing, SendError};
use crate::http1::encode::hex_line;

/// How an upload ended.
pub(super) enum Upload {
    /// The whole body went out.
    Sent,
    /// The backend answered (or closed) first; what it sent is in the buffer.
    Early,
    WriteFailed(io::Error),
}

/// What is left to write of one piece of the body: the chunk-size line, the data,
/// and the line end (or, for the last chunk, the terminator).
#[derive(Default)]
pub(super) struct Piece {
    size: [u8; 18],
    size_len: usize,
    size_at: usize,
    data: Bytes,
    tail: &'static [u8],
}

impl Piece {
    fn data(data: Bytes, chunked: bool) -> Piece {
        let mut p = Piece {
            data,
            ..Piece::default()
        };
        if chunked {
            p.size_len = hex_line(&mut p.size, p.data.len());
            p.tail = b"\r\n";
        }
        p
    }

    fn last_chunk() -> Piece {
        Piece {
            tail: b"0\r\n\r\n",
            ..Piece::default()
        }
    }

    /// The last chunk with trailer fields.
    fn last_chunk_with(trailers: &http::HeaderMap) -> Piece {
        let mut end = Vec::with_capacity(64);
        crate::http1::encode::last_chunk_with(&mut end, trailers);
        Piece {
            data: end.into(),
            ..Piece::default()
        }
    }

    fn is_done(&self) -> bool {
        self.size_at == self.size_len && self.data.is_empty() && self.tail.is_empty()
    }

    fn slices(&self) -> [IoSlice<'_>; 3] {
        [
            IoSlice::new(&self.size[self.size_at..self.size_len]),
            IoSlice::new(&self.data),
            IoSlice::new(self.tail),
        ]
    }

    fn advance(&mut self, mut n: usize) {
        let size = (self.size_len - self.size_at).min(n);
        self.size_at += size;
        n -= size;
        let data = self.data.len().min(n);
        self.data.advance(data);
        n -= data;
        self.tail = &self.tail[n.min(self.tail.len())..];
    }
}

/// The rest of an upload the backend answered before it ended (DESIGN §18.5): it goes
/// on while the answer is read, until it ends or the answer is complete.
pub(crate) struct Rest {
    out: Outgoing,
    piece: Piece,
    chunked: bool,
}

impl Rest {
    pub(super) fn new(out: Outgoing, piece: Piece, chunked: bool) -> Rest {
        Rest {
            out,
            piece,
            chunked,
        }
    }

    /// Writes what it can; ready when the upload ended (sent whole, or failed: the
    /// backend is no longer reading, and its answer says the rest).
    pub(super) fn poll_send<T: AsyncWrite + Unpin>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        loop {
            match step(io, &mut self.out, &mut self.piece, self.chunked, cx) {
                Poll::Ready(None) => continue,
                Poll::Ready(Some(_)) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// How writing the body went, for one poll.
enum Sent {
    Whole,
    WriteFailed(io::Error),
    Body(crate::body::BodyError),
}

/// One step of the upload: one write of what is left of `piece`, or the body's next
/// frame taken; ready with `None` when it made progress (the caller steps again), with
/// `Some` when the upload ended.
fn step<T: AsyncWrite + Unpin>(
    io: &mut T,
    out: &mut Outgoing,
    piece: &mut Piece,
    chunked: bool,
    cx: &mut Context<'_>,
) -> Poll<Option<Sent>> {
    loop {
        if !piece.is_done() {
            return match Pin::new(&mut *io).poll_write_vectored(cx, &piece.slices()) {
                Poll::Ready(Ok(0)) => {
                    Poll::Ready(Some(Sent::WriteFailed(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => {
                    piece.advance(n);
                    Poll::Ready(None)
                }
                Poll::Ready(Err(e)) => Poll::Ready(Some(Sent::WriteFailed(e))),
                Poll::Pending => Poll::Pending,
            };
        }
        if out.body_ended {
            return match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Ready(Ok(())) => Poll::Ready(Some(Sent::Whole)),
                Poll::Ready(Err(e)) => Poll::Ready(Some(Sent::WriteFailed(e))),
                Poll::Pending => Poll::Pending,
            };
        }
        match Pin::new(&mut out.body).poll_frame(cx) {
            // Nothing more to send yet: what the writer still holds (a TLS session's
            // records) goes out now, not with the next piece — a backend may answer
            // only once it has read everything so far.
            Poll::Pending => {
                return match Pin::new(&mut *io).poll_flush(cx) {
                    Poll::Ready(Err(e)) => Poll::Ready(Some(Sent::WriteFailed(e))),
                    _ => Poll::Pending,
                }
            }
            Poll::Ready(None) => {
                out.body_ended = true;
                if chunked {
                    *piece = Piece::last_chunk();
                }
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Sent::Body(e))),
            Poll::Ready(Some(Ok(frame))) => {
                let data = match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        // Trailers end the body; with a declared length they cannot go.
                        if let (true, Some(t)) = (chunked, frame.trailers_ref()) {
                            out.body_ended = true;
                            *piece = Piece::last_chunk_with(t);
                        }
                        continue;
                    }
                };
                if !data.is_empty() {
                    out.sent(&data);
                    *piece = Piece::data(data, chunked);
                }
            }
        }
    }
}

/// Sends what is left of `out`'s body over `io` (see the module); the piece under way
/// is `piece`, so an upload the backend answered can go on. Bytes the backend sends
/// meanwhile go to `buf`.
pub(super) async fn upload<T: AsyncRead + AsyncWrite + Unpin>(
    io: &mut T,
    buf: &mut BytesMut,
    out: &mut Outgoing,
    chunked: bool,
    piece: &mut Piece,
) -> Result<Upload, SendError> {
    std::future::poll_fn(|cx| loop {
        // The backend spoke: its answer comes before the rest of the upload.
        let mut first = [const { MaybeUninit::<u8>::uninit() }; 4096];
        let mut rb = ReadBuf::uninit(&mut first);
        match Pin::new(&mut *io).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                buf.extend_from_slice(rb.filled());
                return Poll::Ready(Ok(Upload::Early));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(SendError::Io(e))),
            Poll::Pending => {}
        }
        return match step(io, out, piece, chunked, cx) {
            Poll::Ready(None) => continue,
            Poll::Ready(Some(Sent::Whole)) => Poll::Ready(Ok(Upload::Sent)),
            Poll::Ready(Some(Sent::WriteFailed(e))) => Poll::Ready(Ok(Upload::WriteFailed(e))),
            Poll::Ready(Some(Sent::Body(e))) => Poll::Ready(Err(SendError::Body(e))),
            Poll::Pending => Poll::Pending,
        };
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// However a writer splits its progress, a piece writes exactly its bytes.
        #[test]
        fn a_piece_advances_to_exactly_its_bytes(
            len in 0usize..300,
            chunked: bool,
            steps in proptest::collection::vec(1usize..40, 1..100),
        ) {
            let data = Bytes::from(vec![b'x'; len]);
            let mut p = Piece::data(data.clone(), chunked);
            let mut want = Vec::new();
            if chunked {
                want.extend_from_slice(format!("{len:x}\r\n").as_bytes());
            }
            want.extend_from_slice(&data);
            if chunked {
                want.extend_from_slice(b"\r\n");
            }
            let mut got = Vec::new();
            for step in steps.into_iter().cycle() {
                if p.is_done() {
                    break;
                }
                let flat: Vec<u8> = p.slices().iter().flat_map(|s| s.to_vec()).collect();
                let n = step.min(flat.len());
                got.extend_from_slice(&flat[..n]);
                p.advance(n);
            }
            proptest::prop_assert_eq!(got, want);
        }
    }
}
