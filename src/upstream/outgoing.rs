//! A request on its way to a backend, as the attempts see it: the head, the body's
//! framing, the frames taken for a write not yet known to have gone out, and the
//! replay buffer that lets a request be sent again after it reached a backend. And
//! why sending failed.

use std::io;

use bytes::Bytes;
use http::header;
use http::Request;
use http_body::Body as _;
use http_body_util::BodyExt;

use crate::body::{Body, BodyError};
use crate::http1::encode::BodyOut;

/// A request on its way to a backend: its head, how its body is framed (decided once,
/// before any of it is read), the body still to come, and the body frames already
/// taken for a write that has not been known to go out, so that a connection found
/// closed before the request left can hand it back whole.
pub(crate) struct Outgoing {
    pub parts: http::request::Parts,
    pub body: Body,
    pub(super) framing: BodyOut,
    /// Data frames taken from `body` for a write that has not gone out yet.
    pub(super) resend: Vec<Bytes>,
    /// `body` ended while its frames were taken.
    pub(super) body_ended: bool,
    /// The replay buffer, for a request that may be retried after it was sent.
    kept: Option<Kept>,
    /// Some of the body was handed to an HTTP/2 stream.
    taken: bool,
    /// A gRPC call's deadline (`grpc-timeout`): what is left of it goes to the backend.
    pub deadline: Option<std::time::Instant>,
    /// What is left of the upload after an HTTP/1.1 backend's answer began (DESIGN
    /// §18.5): it goes on while the answer is read.
    pub upload: Option<Box<super::upload::Rest>>,
    /// An HTTP/1 backend's answer may keep its fields as sent (`http1::head::AsSent`).
    pub as_sent: Option<crate::http1::head::AsSent>,
    /// The fields an HTTP/1 backend gets, written already (`proxy::headers::forwarded`):
    /// `parts.headers` is then the client's map as it came, which an HTTP/2 backend
    /// must not be sent before the proxy's work is done on it.
    pub lines: Option<Vec<u8>>,
}

/// Every body frame sent so far, up to a cap: past it, the request can no longer be
/// sent again and the frames are let go.
struct Kept {
    frames: Vec<Bytes>,
    bytes: u64,
    limit: u64,
    overflowed: bool,
}

impl Kept {
    fn push(&mut self, data: Bytes) {
        if self.overflowed || data.is_empty() {
            return;
        }
        self.bytes += data.len() as u64;
        if self.bytes > self.limit {
            self.overflowed = true;
            self.frames = Vec::new();
        } else {
            self.frames.push(data);
        }
    }
}

impl Outgoing {
    #[inline]
    pub(crate) fn new(req: Request<Body>) -> Outgoing {
        let (parts, body) = req.into_parts();
        Outgoing::from_parts(parts, body)
    }

    #[inline]
    pub(crate) fn from_parts(parts: http::request::Parts, body: Body) -> Outgoing {
        Outgoing::framed(parts, body, |p| {
            p.headers.contains_key(header::CONTENT_LENGTH)
        })
    }

    /// `declared`: whether the fields the request goes out with carry its
    /// `Content-Length` (its map, or the lines written for it); asked only when there
    /// is a body to frame.
    #[inline]
    pub(crate) fn framed(
        parts: http::request::Parts,
        body: Body,
        declared: impl FnOnce(&http::request::Parts) -> bool,
    ) -> Outgoing {
        let framing = if body.is_end_stream() {
            BodyOut::Empty
        } else if declared(&parts) {
            BodyOut::Declared
        } else if let Some(n) = body.size_hint().exact() {
            BodyOut::Length(n)
        } else {
            BodyOut::Chunked
        };
        Outgoing {
            parts,
            body,
            framing,
            resend: Vec::new(),
            body_ended: false,
            kept: None,
            taken: false,
            deadline: None,
            upload: None,
            as_sent: None,
            lines: None,
        }
    }

    /// Keeps the body as it is sent, up to `limit` bytes, so the request can go out
    /// again after it reached a backend (`retry_on`).
    pub(crate) fn keep_for_replay(&mut self, limit: u64) {
        self.kept = Some(Kept {
            frames: Vec::new(),
            bytes: 0,
            limit,
            overflowed: false,
        });
    }

    /// Whether [`Self::rewind`] would succeed.
    pub(crate) fn can_rewind(&self) -> bool {
        self.kept.as_ref().is_some_and(|k| !k.overflowed)
    }

    /// Makes the request ready to go out again from its start. `false`: it cannot (not
    /// kept, or its body outgrew the replay buffer).
    pub(crate) fn rewind(&mut self) -> bool {
        match &mut self.kept {
            Some(k) if !k.overflowed => {
                self.resend = std::mem::take(&mut k.frames);
                k.bytes = 0;
                true
            }
            _ => false,
        }
    }

    /// Nothing of a body to send: the request is its head alone.
    pub(crate) fn nothing_to_send(&self) -> bool {
        self.framing == BodyOut::Empty
    }

    /// The next body frame for an HTTP/2 stream (which buffers what it takes): frames
    /// an earlier attempt left first, then the body's. Kept for replay as taken.
    pub(crate) async fn next_frame(
        &mut self,
    ) -> Result<Option<http_body::Frame<Bytes>>, BodyError> {
        if !self.resend.is_empty() {
            let data = self.resend.remove(0);
            self.taken = true;
            self.sent(&data);
            return Ok(Some(http_body::Frame::data(data)));
        }
        if self.body_ended || self.framing == BodyOut::Empty {
            return Ok(None);
        }
        match self.body.frame().await {
            None => {
                self.body_ended = true;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    self.taken = true;
                    let data = data.clone();
                    self.sent(&data);
                }
                Ok(Some(frame))
            }
        }
    }

    /// What is left to send once an answer came: the body and the frames an earlier
    /// attempt left, moved out (the head and the replay buffer are no longer needed).
    pub(crate) fn take_rest(&mut self) -> Outgoing {
        let (parts, ()) = Request::new(()).into_parts();
        Outgoing {
            parts,
            body: std::mem::replace(&mut self.body, Body::Empty),
            framing: self.framing,
            resend: std::mem::take(&mut self.resend),
            body_ended: self.body_ended,
            kept: None,
            taken: true,
            deadline: None,
            upload: None,
            as_sent: None,
            lines: None,
        }
    }

    /// Sets `grpc-timeout` to what is left of the deadline; `false` when nothing is.
    pub(crate) fn pass_deadline_on(&mut self) -> bool {
        let Some(d) = self.deadline else {
            return true;
        };
        let left = d.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        self.parts.headers.insert(
            crate::grpc::GRPC_TIMEOUT.clone(),
            crate::grpc::format_timeout(left),
        );
        true
    }

    /// After an HTTP/2 stream the backend never processed: whether the request can go
    /// out again whole (nothing was taken, or the replay buffer has it all).
    pub(crate) fn rewind_all(&mut self) -> bool {
        !self.taken || self.rewind()
    }

    pub(super) fn sent(&mut self, data: &Bytes) {
        if let Some(k) = &mut self.kept {
            k.push(data.clone());
        }
    }
}

/// How an unanswered request's connection ended, as the log says it.
fn unanswered(e: Option<&io::Error>) -> String {
    match e {
        None => "connection closed before a response".to_string(),
        Some(e) => format!("{e} before a response"),
    }
}

/// Why sending a request or reading its answer failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// Not one byte of the request went out (a pooled connection the backend had
    /// closed): the `Outgoing` still holds all of it, to go out on a fresh connection.
    #[error("connection closed before the request went out")]
    NotSent,
    /// The client's body failed: its fault, not the backend's.
    #[error("{0}")]
    Body(BodyError),
    /// The connection broke with the request on it.
    #[error("{0}")]
    Io(io::Error),
    /// The connection closed or was reset after the request went out and before one
    /// byte of an answer: a kept connection the backend closed as the request arrived,
    /// or a backend that dropped the request. With the OS's word when it was not a
    /// clean close (a reset): the log states it (DESIGN §18.4).
    #[error("{}", unanswered(.0.as_ref()))]
    Unanswered(Option<io::Error>),
    /// The connection closed within a response head (or after an interim answer).
    #[error("connection closed within a response head")]
    ClosedEarly,
    /// The backend's response head breaks HTTP.
    #[error("invalid response: {0}")]
    Invalid(&'static str),
    /// No response head within the pool's `timeout` (not the peer's failure).
    #[error("no response head in time")]
    TimedOut,
    /// The HTTP/2 library refused the request before it had a stream (its fields break
    /// HTTP/2): the request's fault, never the peer's.
    #[error("the request cannot be sent over HTTP/2: {0}")]
    Unsendable(String),
}
