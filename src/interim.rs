//! Interim answers (`103 Early Hints`, and any other 1xx but `100` and `101`) a backend
//! sent before its final one, on their way to the client (DESIGN §18.5).
//!
//! A thread-local, not a channel: the connection that will write them polls the
//! handler's future itself, and the backend side reads an interim head within that
//! poll, on that thread, in that task. So a relayed head waits in a thread-local,
//! tagged with the task that read it, and the connection looks right after each poll
//! of the request's future ([`held`], [`take`]: one thread-local read when there is
//! nothing) and writes it before the final head. Nothing is allocated, no waker is
//! registered and no flag is set around a poll for a request that gets none. Every
//! front looks: HTTP/1.1 (`server::h1`), HTTP/2 (`server::h2::send::answer`, whose
//! streams share their connection's task but take what their own poll relayed before
//! another stream is polled) and HTTP/3. A head no connection takes — relayed for an
//! HTTP/1.0 client, which must not get one, or a cache's fill — is dropped by the next
//! look of a task that is not its own. Never stored by a cache: only final answers are.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::task::Poll;

use http::{HeaderMap, StatusCode};

/// At most this many interim answers wait to be written; more are dropped.
const MAX_PENDING: usize = 16;

/// Interim heads, oldest first.
pub(crate) type Heads = Vec<(StatusCode, HeaderMap)>;

thread_local! {
    /// Something was relayed and waits in `HEADS`.
    static HELD: Cell<bool> = const { Cell::new(false) };
    static HEADS: RefCell<(Option<tokio::task::Id>, Heads)> = const { RefCell::new((None, Vec::new())) };
}

/// What was relayed in this task, oldest first (nothing: one thread-local read).
#[inline]
pub(crate) fn take() -> Option<Heads> {
    if !HELD.with(Cell::get) {
        return None;
    }
    take_held()
}

#[cold]
fn take_held() -> Option<Heads> {
    HELD.with(|h| h.set(false));
    let (task, heads) = HEADS.with(|h| std::mem::take(&mut *h.borrow_mut()));
    (task == tokio::task::try_id() && !heads.is_empty()).then_some(heads)
}

/// Ready with what the request's poll just before it (in the same `select!`, the same
/// task) relayed; never ready otherwise, and needs no waker: that poll comes first.
pub(crate) fn held() -> impl Future<Output = Heads> {
    std::future::poll_fn(|_| match take() {
        Some(heads) => Poll::Ready(heads),
        None => Poll::Pending,
    })
}

/// A backend's interim answer: relayed unless it is `100` or `101` (sluice answers
/// `Expect` itself; a switch is not interim), without connection-level fields.
pub(crate) fn relay(status: StatusCode, mut headers: HeaderMap) {
    if !status.is_informational()
        || status == StatusCode::CONTINUE
        || status == StatusCode::SWITCHING_PROTOCOLS
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
    let task = tokio::task::try_id();
    HEADS.with(|h| {
        let mut h = h.borrow_mut();
        if h.0 != task {
            // Another task's, never taken: dropped.
            *h = (task, Vec::new());
        }
        if h.1.len() < MAX_PENDING {
            h.1.push((status, headers));
        }
    });
    HELD.with(|h| h.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_relaying_task_takes() {
        let mut h = HeaderMap::new();
        h.insert("link", "</a.css>; rel=preload".parse().unwrap());
        h.insert("connection", "close".parse().unwrap());
        tokio::spawn(async move {
            relay(StatusCode::CONTINUE, HeaderMap::new());
            relay(StatusCode::EARLY_HINTS, h);
            let heads = take().unwrap();
            assert_eq!(heads.len(), 1, "not 100");
            assert_eq!(heads[0].0, StatusCode::EARLY_HINTS);
            assert!(heads[0].1.contains_key("link"));
            assert!(!heads[0].1.contains_key("connection"));
            assert!(take().is_none());
            // Relayed here, looked for by another task: dropped.
            relay(StatusCode::EARLY_HINTS, HeaderMap::new());
        })
        .await
        .unwrap();
        // The same thread (a current-thread runtime), another task: nothing to take.
        assert!(take().is_none(), "another task's interim answer");
        relay(StatusCode::EARLY_HINTS, HeaderMap::new());
        assert_eq!(take().map(|h| h.len()), Some(1));
    }
}
