//! What HTTP/1.1, HTTP/2 and HTTP/3 connections share: their time limits, the access
//! log as they see it, a request body counted for a meter, the end of an h2 or h3
//! stream's answer (its log line and meter), the connection-level fields no h2 or h3
//! head carries, and `:authority` as the host.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Response;
use http_body::{Frame, SizeHint};

use crate::access::{AccessLog, Pending};
use crate::body::{Body, BodyError};

/// A new connection's first head, and any later head once its first byte arrived,
/// must be complete within this.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A kept-alive connection with no byte of a next request closes after this.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) use crate::body::BODY_READ_TIMEOUT;

/// The access log as the connections see it; a reload may swap it.
pub(crate) type Access = Arc<arc_swap::ArcSwapOption<AccessLog>>;

/// Fields that name an HTTP/1.1 connection's own framing: never sent in an HTTP/2 or
/// HTTP/3 response (RFC 9113 §8.2.2, RFC 9114 §4.2), malformed in an HTTP/3 request
/// (the `h2` crate refuses them in an HTTP/2 one).
pub(super) const CONNECTION_FIELDS: [header::HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HeaderName::from_static("keep-alive"),
    header::HeaderName::from_static("proxy-connection"),
];

/// Readies an answer's fields for an HTTP/2 or HTTP/3 head: the connection fields and
/// `TE` go, and `Date` comes when the answer has none. One walk over the names finds
/// both, where a lookup a name hashed each (~700 instructions a request); an answer
/// with no connection field and no `TE`, nearly every one, keeps its fields (only a
/// `Date` may be added).
pub(super) fn ready_for_streams(headers: &mut http::HeaderMap) {
    let (mut connection, mut date) = (false, false);
    for name in headers.keys() {
        if *name == header::DATE {
            date = true;
        } else if *name == header::TE || CONNECTION_FIELDS.contains(name) {
            connection = true;
        }
    }
    if connection {
        for name in &CONNECTION_FIELDS {
            headers.remove(name);
        }
        headers.remove(header::TE);
    }
    if !date {
        headers.insert(header::DATE, crate::reply::date());
    }
}

/// A request body whose bytes are counted as they are read (for a meter); what had
/// arrived of it when the handler let it go unread counts too (DESIGN §18.4).
pub(super) struct Counted {
    pub body: Body,
    pub n: Arc<AtomicU64>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        // Only what is here already: a waker that never wakes, no wait.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        use http_body::Body as _;
        while let Poll::Ready(Some(Ok(f))) = Pin::new(&mut self.body).poll_frame(&mut cx) {
            let len = f.data_ref().map_or(0, |d| d.len() as u64);
            self.n.fetch_add(len, Ordering::Relaxed);
        }
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            let len = f.data_ref().map_or(0, |d| d.len() as u64);
            self.n.fetch_add(len, Ordering::Relaxed);
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

/// What an h2 or h3 response leaves when its body is done: its access log line and
/// its count on the route's meter.
pub(super) struct StreamDone {
    pub log: Option<StreamLog>,
    /// The route's meter, and when the request began.
    pub metered: Option<(Arc<crate::stats::Meter>, Instant)>,
    /// The request body's bytes so far (counted for a meter).
    pub received: Option<Arc<AtomicU64>>,
    pub status: u16,
    /// An extended CONNECT that opened a tunnel.
    pub switched: bool,
    pub bytes: u64,
    /// The client stopped the stream before the body ended: counted and logged as
    /// `499` (DESIGN §18.4), with the bytes sent.
    pub cut: bool,
}

pub(super) struct StreamLog {
    pub pending: Pending,
    pub served: Option<crate::pipeline::Served>,
    pub marks: crate::access::Marks,
}

impl StreamDone {
    /// What `resp` leaves for when its body is done; `None` when neither the log nor a
    /// meter wants it.
    pub(super) fn new(
        log: Option<StreamLog>,
        metered: Option<(Arc<crate::stats::Meter>, Instant)>,
        received: Option<Arc<AtomicU64>>,
        resp: &Response<Body>,
        switched: bool,
    ) -> Option<StreamDone> {
        (log.is_some() || metered.is_some()).then(|| StreamDone {
            log,
            metered,
            received,
            status: resp.status().as_u16(),
            switched,
            bytes: 0,
            cut: false,
        })
    }
}

impl Drop for StreamDone {
    fn drop(&mut self) {
        let done = Instant::now();
        if let Some((m, started)) = &self.metered {
            let received = self
                .received
                .as_ref()
                .map_or(0, |n| n.load(Ordering::Relaxed));
            let status = match (self.cut, self.switched) {
                (true, _) => 499,
                (false, true) => 101,
                (false, false) => self.status,
            };
            m.record(status, done - *started, received, self.bytes);
        }
        let status = if self.cut { 499 } else { self.status };
        if let Some(l) = &mut self.log {
            let upstream = l.served.as_ref().map(crate::access::Upstream::from);
            l.pending
                .finish(status, self.bytes, upstream, Some(&l.marks), done);
        }
    }
}

/// `:authority` is the host, for routing and the backend alike: it replaces any Host.
/// Why the request is refused instead, if it is.
pub(super) fn host_from_authority<B>(req: &mut http::Request<B>) -> Option<&'static str> {
    match req
        .uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        // RFC 9113 §8.3.1: no userinfo; an HTTP/1.1 Host could not carry it.
        Some(v) if v.as_bytes().contains(&b'@') => Some("Bad request: userinfo in :authority\n"),
        Some(v) => {
            req.headers_mut().insert(header::HOST, v);
            None
        }
        // Two Hosts and no `:authority`: which one the backend believes is anyone's
        // guess, so refused as on HTTP/1.1.
        None if req.headers().get_all(header::HOST).iter().nth(1).is_some() => {
            Some("Bad request: more than one Host\n")
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;
    use proptest::prelude::*;

    use super::*;

    const NAMES: [&str; 10] = [
        "connection",
        "transfer-encoding",
        "upgrade",
        "keep-alive",
        "proxy-connection",
        "te",
        "date",
        "content-type",
        "x-keep-alive",
        "server",
    ];

    proptest! {
        /// The one walk leaves what a lookup a name left: no connection field, no
        /// `TE`, a `Date` (the answer's own when it had one), every other field as it
        /// was, in its order.
        #[test]
        fn ready_for_streams_is_a_lookup_a_name(fields in proptest::collection::vec((0..NAMES.len(), 0u8..4), 0..12)) {
            let mut map = HeaderMap::new();
            for (i, v) in &fields {
                map.append(NAMES[*i], HeaderValue::from(u16::from(*v)));
            }
            let mut want = map.clone();
            for name in &CONNECTION_FIELDS {
                want.remove(name);
            }
            want.remove(header::TE);
            let had_date = want.contains_key(header::DATE);
            ready_for_streams(&mut map);
            if !had_date {
                prop_assert!(map.contains_key(header::DATE));
                map.remove(header::DATE);
            }
            prop_assert_eq!(map, want);
        }
    }
}
