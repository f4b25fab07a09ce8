//! "Buffer until released": the body mode between streaming and the whole-body cap.
//!
//! A filter that must look at the request body before any of it leaves declares a
//! [`Hold`]: the pipeline reads the body into memory, chunk by chunk, showing each to
//! the filter's [`Watch`], until the watch releases it, the body ends, or `cap` bytes
//! are held. A refusal then answers at once and nothing reached the handler. Past
//! the cap (or after a release that keeps watching) the held chunks go first and the
//! rest streams, each chunk still shown to the watch; a refusal then cuts the body
//! off, and the pipeline answers with the filter's refusal whatever the handler made
//! of the broken body.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;

use crate::body::{Body, BodyError};

/// The most request-body bytes held at once by the whole process: past it a request
/// that would hold more gets `503` (and `Retry-After: 1`) rather than memory without
/// bound (counted in `sluice_body_hold_refusals_total`).
pub(crate) const HOLD_BUDGET: u64 = 64 << 20;

/// Bytes held now, process-wide.
static HELD: AtomicU64 = AtomicU64::new(0);

/// A share of [`HOLD_BUDGET`], given back when dropped.
#[derive(Default)]
struct Reserved(u64);

impl Reserved {
    /// Takes `n` more bytes of the budget; `false` when that would pass it.
    fn grow(&mut self, n: u64) -> bool {
        let before = HELD.fetch_add(n, Ordering::AcqRel);
        if before + n > HOLD_BUDGET {
            HELD.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        self.0 += n;
        true
    }

    fn release(&mut self) {
        HELD.fetch_sub(std::mem::take(&mut self.0), Ordering::AcqRel);
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.release();
    }
}

fn budget_spent() -> Response<Body> {
    crate::stats::bump(&crate::stats::COUNTERS.body_hold_refusals);
    crate::throttle::BODY_HOLD_FULL.warn(format_args!(
        "sluice: request bodies held for checking reached {} MiB; answered 503",
        HOLD_BUDGET >> 20
    ));
    let mut r = crate::reply::local_response(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "Service unavailable: too many request bodies are being checked\n",
    );
    r.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    r
}

/// What a filter holds the body for.
pub(crate) struct Hold {
    /// The most bytes held before the rest streams.
    pub cap: u64,
    pub watch: Box<dyn Watch>,
    /// The filter's refusal (it counts it too).
    pub refuse: fn() -> Response<Body>,
}

/// Looks at each chunk of one request's body.
pub(crate) trait Watch: Send {
    fn chunk(&mut self, data: &[u8]) -> Verdict;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Keep holding, and keep watching.
    Hold,
    /// Let what is held go, and stop watching. (No built-in releases early: `body_deny`
    /// must see every byte; the mode's tests drive it.)
    #[cfg_attr(not(test), allow(dead_code))]
    Release,
    /// Refuse the request.
    Refuse,
}

/// A refusal that came after the body began to stream: set by the body, read by the
/// pipeline once the handler returns.
#[derive(Clone)]
pub(crate) struct Refused {
    flag: Arc<AtomicBool>,
    pub refuse: fn() -> Response<Body>,
}

impl Refused {
    pub(crate) fn happened(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// Why [`hold`] stopped the request.
pub(crate) enum Stopped {
    /// The watch refused the body: answer with the filter's refusal — or, when a
    /// branch goes on instead, with the whole body as it came (what was held, then the
    /// rest, unwatched), never a shortened one.
    Refused(Body),
    /// The body broke off or passed a limit: 400 or 413.
    Failed(Response<Body>),
}

/// Reads `body` under `hold`. `Ok`: the body to go on with, and — when its end was not
/// held — the flag a later refusal sets.
pub(crate) async fn hold(mut body: Body, hold: Hold) -> Result<(Body, Option<Refused>), Stopped> {
    let Hold {
        cap,
        mut watch,
        refuse,
    } = hold;
    let declared = body.size_hint().exact();
    let mut held = VecDeque::new();
    let mut size = 0u64;
    let mut watching = true;
    let mut reserved = Reserved::default();
    while size < cap && watching {
        let frame = match body.frame().await {
            None => {
                // The end is here: what is held is the whole body.
                let whole = Held {
                    frames: held,
                    reserved,
                    rest: None,
                    left: Some(size),
                };
                return Ok((Body::stream(whole), None));
            }
            Some(Err(e)) => return Err(Stopped::Failed(super::body_failed(e))),
            Some(Ok(f)) => f,
        };
        let verdict = match frame.data_ref() {
            Some(d) => {
                if !reserved.grow(d.len() as u64) {
                    return Err(Stopped::Failed(budget_spent()));
                }
                size += d.len() as u64;
                watch.chunk(d)
            }
            None => Verdict::Hold,
        };
        held.push_back(frame);
        match verdict {
            Verdict::Hold => {}
            Verdict::Release => watching = false,
            Verdict::Refuse => {
                let whole = Held {
                    frames: held,
                    reserved,
                    rest: Some(Rest {
                        body,
                        watch: None,
                        flag: None,
                    }),
                    left: declared,
                };
                return Err(Stopped::Refused(Body::stream(whole)));
            }
        }
    }
    let refused = watching.then(|| Refused {
        flag: Arc::new(AtomicBool::new(false)),
        refuse,
    });
    let rest = Rest {
        body,
        watch: watching.then_some(watch),
        flag: refused.as_ref().map(|r| r.flag.clone()),
    };
    let held = Held {
        frames: held,
        reserved,
        rest: Some(rest),
        left: declared,
    };
    Ok((Body::stream(held), refused))
}

/// The held frames, then the rest of the body (watched) if it did not end.
struct Held {
    frames: VecDeque<Frame<Bytes>>,
    /// The budget the held frames take, given back once they are all sent.
    reserved: Reserved,
    rest: Option<Rest>,
    /// Bytes still to come, when known (a declared length, or a body held whole).
    left: Option<u64>,
}

struct Rest {
    body: Body,
    watch: Option<Box<dyn Watch>>,
    flag: Option<Arc<AtomicBool>>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let frame = match this.frames.pop_front() {
            Some(f) => {
                if this.frames.is_empty() {
                    this.reserved.release();
                }
                f
            }
            None => {
                let Some(rest) = this.rest.as_mut() else {
                    return Poll::Ready(None);
                };
                match ready!(Pin::new(&mut rest.body).poll_frame(cx)) {
                    Some(Ok(f)) => {
                        let refused = f
                            .data_ref()
                            .zip(rest.watch.as_mut())
                            .is_some_and(|(d, w)| w.chunk(d) == Verdict::Refuse);
                        if refused {
                            if let Some(flag) = &rest.flag {
                                flag.store(true, Ordering::Release);
                            }
                            this.rest = None;
                            return Poll::Ready(Some(Err(BodyError::Refused)));
                        }
                        f
                    }
                    other => return Poll::Ready(other),
                }
            }
        };
        if let (Some(left), Some(d)) = (this.left.as_mut(), frame.data_ref()) {
            *left = left.saturating_sub(d.len() as u64);
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refuses a body holding `x`; holds everything else.
    struct NoX;
    impl Watch for NoX {
        fn chunk(&mut self, data: &[u8]) -> Verdict {
            if data.contains(&b'x') {
                Verdict::Refuse
            } else {
                Verdict::Hold
            }
        }
    }

    fn forbidden() -> Response<Body> {
        crate::reply::local_response(http::StatusCode::FORBIDDEN, "Forbidden\n")
    }

    fn streamed(chunks: &[&'static [u8]], len: Option<u64>) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for c in chunks {
            tx.try_send(Ok(http_body::Frame::data(Bytes::from_static(c))))
                .unwrap();
        }
        Body::Channel {
            rx,
            len,
            want: None,
        }
    }

    fn nox(cap: u64) -> Hold {
        Hold {
            cap,
            watch: Box::new(NoX),
            refuse: forbidden,
        }
    }

    #[tokio::test]
    async fn a_body_under_the_cap_is_held_whole_with_its_length() {
        let (b, refused) = hold(streamed(&[b"ab", b"cd"], None), nox(100))
            .await
            .ok()
            .unwrap();
        assert!(refused.is_none());
        assert_eq!(b.size_hint().exact(), Some(4));
        assert_eq!(b.collect().await.unwrap().to_bytes(), "abcd");
    }

    #[tokio::test]
    async fn a_refusal_inside_the_cap_answers_at_once() {
        let r = hold(streamed(&[b"ab", b"cx", b"yz"], Some(6)), nox(100)).await;
        let Err(Stopped::Refused(b)) = r else {
            panic!("refused")
        };
        // A branch that goes on gets the whole body, not what is left of it.
        assert_eq!(b.size_hint().exact(), Some(6));
        assert_eq!(b.collect().await.unwrap().to_bytes(), "abcxyz");
    }

    #[tokio::test]
    async fn past_the_cap_the_rest_streams_and_a_refusal_cuts_it() {
        let (b, refused) = hold(streamed(&[b"ab", b"cd", b"ex", b"gh"], Some(8)), nox(3))
            .await
            .ok()
            .unwrap();
        let refused = refused.unwrap();
        assert_eq!(b.size_hint().exact(), Some(8));
        assert!(!refused.happened());
        let e = b.collect().await.err().unwrap();
        assert!(matches!(e, BodyError::Refused));
        assert!(refused.happened());
    }

    /// Releases after the first chunk.
    struct First;
    impl Watch for First {
        fn chunk(&mut self, _: &[u8]) -> Verdict {
            Verdict::Release
        }
    }

    #[tokio::test]
    async fn a_release_lets_the_rest_stream_unwatched() {
        let h = Hold {
            cap: 100,
            watch: Box::new(First),
            refuse: forbidden,
        };
        let (b, refused) = hold(streamed(&[b"ab", b"xx"], Some(4)), h)
            .await
            .ok()
            .unwrap();
        assert!(refused.is_none());
        assert_eq!(b.size_hint().exact(), Some(4));
        assert_eq!(b.collect().await.unwrap().to_bytes(), "abxx");
    }

    #[tokio::test]
    async fn past_the_cap_a_clean_body_streams_whole() {
        let (b, refused) = hold(streamed(&[b"ab", b"cd", b"ef"], None), nox(3))
            .await
            .ok()
            .unwrap();
        assert_eq!(b.collect().await.unwrap().to_bytes(), "abcdef");
        assert!(!refused.unwrap().happened());
    }
}
