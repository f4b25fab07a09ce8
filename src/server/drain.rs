//! Graceful shutdown: counts open connections and in-flight requests, and tells
//! connections when sluice stops taking new work. Atomics and one watch channel; no lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

use super::idle::Wheel;

#[derive(Clone)]
pub(crate) struct Drain {
    inner: Arc<Inner>,
}

struct Inner {
    connections: AtomicUsize,
    requests: AtomicUsize,
    idle: Notify,
    /// 0 while serving, 1 once an upgrade handed the listeners on ([`Drain::step_aside`]),
    /// 2 once shutdown started ([`Drain::start`]).
    tx: watch::Sender<u8>,
    /// Where kept-alive connections wait for their next request.
    wheel: Arc<Wheel>,
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drain {
    pub(crate) fn new() -> Self {
        Drain {
            inner: Arc::new(Inner {
                connections: AtomicUsize::new(0),
                requests: AtomicUsize::new(0),
                idle: Notify::new(),
                tx: watch::channel(0).0,
                wheel: Wheel::new(),
            }),
        }
    }

    pub(crate) fn watch(&self) -> Watch {
        watch(&self.inner)
    }

    pub(crate) fn connection(&self) -> ConnectionGuard {
        self.inner.connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard {
            inner: self.inner.clone(),
        }
    }

    pub(crate) fn request(&self) -> RequestGuard {
        request(&self.inner)
    }

    /// Stop taking new work: listeners stop accepting, idle connections close.
    pub(crate) fn start(&self) {
        self.inner.tx.send_replace(2);
        self.inner.wheel.drain();
    }

    /// After an upgrade: listeners stop accepting (the new process accepts on the same
    /// sockets), HTTP/2 and HTTP/3 connections are sent GOAWAY, and HTTP/1.1
    /// connections answer their next request with `Connection: close` — an idle one is
    /// not closed under a client that may be sending its next request right now.
    pub(crate) fn step_aside(&self) {
        self.inner.tx.send_if_modified(|v| {
            let was = *v;
            *v = was.max(1);
            was == 0
        });
        self.inner.wheel.close_after_response();
    }

    /// Connections counted open (taken by an accept loop and not yet closed).
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.inner.connections.load(Ordering::Relaxed)
    }

    pub(crate) fn requests_in_flight(&self) -> usize {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Resolves when no connection is open.
    pub(crate) async fn closed(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.inner.connections.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

fn request(inner: &Arc<Inner>) -> RequestGuard {
    inner.requests.fetch_add(1, Ordering::Relaxed);
    RequestGuard {
        inner: inner.clone(),
    }
}

fn watch(inner: &Inner) -> Watch {
    Watch {
        rx: inner.tx.subscribe(),
    }
}

pub(crate) struct Watch {
    rx: watch::Receiver<u8>,
}

impl Watch {
    /// Resolves once shutdown has started.
    pub(crate) async fn draining(&mut self) {
        let _ = self.rx.wait_for(|d| *d >= 2).await;
    }

    /// Resolves once this process stops taking new connections: shutdown, or an
    /// upgrade handed its listeners on.
    pub(crate) async fn closing(&mut self) {
        let _ = self.rx.wait_for(|d| *d >= 1).await;
    }

    /// Whether an upgrade handed the listeners on (and no shutdown began since).
    pub(crate) fn stepped_aside(&self) -> bool {
        *self.rx.borrow() == 1
    }
}

pub(crate) struct ConnectionGuard {
    inner: Arc<Inner>,
}

impl ConnectionGuard {
    /// The drain this connection is counted in.
    pub(crate) fn drain(&self) -> Drain {
        Drain {
            inner: self.inner.clone(),
        }
    }

    /// A request of this connection, counted until the guard drops.
    pub(crate) fn request(&self) -> RequestGuard {
        request(&self.inner)
    }

    pub(crate) fn watch(&self) -> Watch {
        watch(&self.inner)
    }

    /// Whether a response should end its connection (`Connection: close`): shutdown
    /// or an upgrade has begun.
    pub(crate) fn is_draining(&self) -> bool {
        self.inner.wheel.ends_keep_alive()
    }

    /// Whether shutdown has begun: a connection between requests closes. (After an
    /// upgrade it does not: its last response may have gone out kept alive, and the
    /// client may be sending the next request now; that one is answered with
    /// `Connection: close`.)
    pub(crate) fn is_stopping(&self) -> bool {
        self.inner.wheel.is_draining()
    }

    /// Where the connection waits while it is idle.
    pub(crate) fn wheel(&self) -> &Arc<Wheel> {
        &self.inner.wheel
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if self.inner.connections.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

pub(crate) struct RequestGuard {
    inner: Arc<Inner>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.inner.requests.fetch_sub(1, Ordering::Relaxed);
    }
}
