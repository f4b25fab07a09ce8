//! Interim answers (`103 Early Hints`, and any other 1xx but `100` and `101`) a backend
//! sent before its final one, on their way to the client (DESIGN §18.5).
//!
//! A thread-local, not a channel: the connection that will write them polls the
//! handler's future itself, and the backend side reads an interim head within that
//! poll, on that thread. So the connection [`watch`]es each poll of the request's
//! future; a head [`relay`]ed during it is handed back when the poll returns, and the
//! connection writes it before the final head. Nothing is allocated and no waker is
//! registered for a request that gets none: a plain request pays one thread-local
//! test a poll. Outside a watched poll (an HTTP/2 client, which hyper's server cannot
//! send 1xx to; an HTTP/1.0 client, which must not get one; a cache's fill) a relayed
//! head is dropped. Never stored by a cache: only final answers are.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, StatusCode};

/// At most this many interim answers are relayed a poll; more are dropped.
const MAX_PENDING: usize = 16;

/// Interim heads, oldest first.
pub(crate) type Heads = Vec<(StatusCode, HeaderMap)>;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static HEADS: RefCell<Heads> = const { RefCell::new(Vec::new()) };
}

/// Runs `poll` (one poll of a request's future) watching for interim answers: what it
/// relayed comes back beside its result.
pub(crate) fn watch<T>(poll: impl FnOnce() -> T) -> (T, Heads) {
    /// Puts the flag back however the poll ends (a panic a connection catches too).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            WATCHING.with(|w| w.set(self.0));
        }
    }
    let outer = WATCHING.with(|w| w.replace(true));
    let restore = Restore(outer);
    let r = poll();
    drop(restore);
    let heads = if outer {
        Vec::new()
    } else {
        HEADS.with(|h| std::mem::take(&mut *h.borrow_mut()))
    };
    (r, heads)
}

/// One [`watch`]ed poll of a request's future: ready with its output, or with interim
/// heads to write first (or both).
pub(crate) fn poll_watched<F: Future + Unpin>(
    fut: &mut F,
    cx: &mut Context<'_>,
) -> Poll<(Option<F::Output>, Heads)> {
    match watch(|| Pin::new(&mut *fut).poll(cx)) {
        (Poll::Ready(a), heads) => Poll::Ready((Some(a), heads)),
        (Poll::Pending, heads) if heads.is_empty() => Poll::Pending,
        (Poll::Pending, heads) => Poll::Ready((None, heads)),
    }
}

/// Whether an interim answer read now would be relayed (else it need not be parsed).
pub(crate) fn wanted() -> bool {
    WATCHING.with(Cell::get)
}

/// A backend's interim answer: relayed when the poll reading it is watched, unless it
/// is `100` or `101` (sluice answers `Expect` itself; a switch is not interim), without
/// connection-level fields.
pub(crate) fn relay(status: StatusCode, mut headers: HeaderMap) {
    if !status.is_informational()
        || status == StatusCode::CONTINUE
        || status == StatusCode::SWITCHING_PROTOCOLS
        || !WATCHING.with(Cell::get)
    {
        return;
    }
    for name in [
        http::header::CONNECTION,
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        http::header::CONTENT_LENGTH,
        http::header::TE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    HEADS.with(|h| {
        let mut h = h.borrow_mut();
        if h.len() < MAX_PENDING {
            h.push((status, headers));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_watched_poll_relays() {
        relay(StatusCode::EARLY_HINTS, HeaderMap::new());
        let ((), heads) = watch(|| {
            relay(StatusCode::CONTINUE, HeaderMap::new());
            let mut h = HeaderMap::new();
            h.insert("link", "</a.css>; rel=preload".parse().unwrap());
            h.insert("connection", "close".parse().unwrap());
            relay(StatusCode::EARLY_HINTS, h);
        });
        assert_eq!(heads.len(), 1, "not the unwatched one, nor 100");
        assert_eq!(heads[0].0, StatusCode::EARLY_HINTS);
        assert!(heads[0].1.contains_key("link"));
        assert!(!heads[0].1.contains_key("connection"));
        let ((), heads) = watch(|| {});
        assert!(heads.is_empty());
    }
}
