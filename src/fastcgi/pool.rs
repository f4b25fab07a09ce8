//! FastCGI connections to one application: at most `max_conns` sockets — idle, busy
//! and being opened alike, each holding a place — taken within one acquisition deadline
//! (`connect_timeout`, covering the wait for a place and the connect). The most recently
//! returned idle connection is used first; idle ones expire oldest first after
//! `keepalive_timeout`. A connection comes back only through [`Pool::release`], which
//! the handler calls after a clean END_REQUEST; every other path drops (closes) it.
//!
//! Kept connections hold the application's workers: php-fpm binds a worker to a
//! keep-conn connection until it closes. With more connections than workers, a new
//! connection waits in the application's accept queue while the workers sit on
//! sluice's idle connections — forever. So a request that has waited over [`STALL`]
//! for its first byte closes the idle connections (their workers then take the waiting
//! ones), and while one waits that long, connections coming back are closed rather than
//! kept. With workers enough, nothing waits that long and every connection is kept.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::upstream::limit::{Limit, Slot};
use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use crate::config::{FastCgiConfig, Target};
use crate::http1::READ_CHUNK;
use crate::net::stream::Stream;
use crate::net::transport::Transport;

/// How long a request may wait for its first byte before kept connections are let go.
pub(crate) const STALL: Duration = Duration::from_millis(50);

pub(crate) struct Pool {
    target: Target,
    /// The generation's resolver; FastCGI addresses are the operator's, so no policy.
    dest: crate::upstream::dial::Dest,
    /// When each request still waiting for its first byte started waiting (by ticket).
    waiting: Mutex<Vec<(u64, Instant)>>,
    next_ticket: std::sync::atomic::AtomicU64,
    /// One place per connection: `max_conns`, resized (never replaced) by a reload.
    places: Arc<Limit>,
    idle: Mutex<VecDeque<(Conn, Instant)>>,
    /// A connection came back idle: a request waiting for a place can take it.
    released: tokio::sync::Notify,
    connect_timeout: Duration,
    keepalive_timeout: Duration,
    /// The application, which knows every pool that reaches it.
    app: Arc<App>,
}

/// One FastCGI application (by address) and the pools that reach it, of every live
/// generation: a stalled request frees workers another route's pool holds.
#[derive(Default)]
pub(crate) struct App {
    pools: Mutex<Vec<std::sync::Weak<Pool>>>,
}

/// A pool's connections at one moment, for `/status` and metrics.
pub(crate) struct Counts {
    /// Open or being opened, idle ones included.
    pub open: usize,
    pub idle: usize,
    /// Requests sent and still waiting for their first byte.
    pub waiting: usize,
    pub max_conns: usize,
}

/// A connection and its place under `max_conns`.
pub(crate) struct Conn {
    io: Stream,
    _place: Slot,
    /// It carried a request before (it may have been closed while idle).
    pub reused: bool,
}

#[derive(Debug)]
pub(crate) enum AcquireError {
    /// No place within the deadline: every connection is busy.
    Busy,
    Dial(String),
}

impl Pool {
    /// The pool of a route in a new generation: the previous generation's (`before`)
    /// when it reaches the same application the same way, its `max_conns` resized (the
    /// places the old generation's requests hold count under the new cap), else a new
    /// one (the old one closes as its last requests end).
    pub(crate) fn carry(
        before: Option<&Arc<Pool>>,
        cfg: &FastCgiConfig,
        dns: &Arc<crate::safety::Dns>,
        app: &Arc<App>,
    ) -> Arc<Pool> {
        match before {
            Some(p) if p.reaches_like(cfg, dns) => {
                p.places.resize(cfg.max_conns);
                p.clone()
            }
            _ => Pool::new(cfg, dns.clone(), app.clone()),
        }
    }

    fn new(cfg: &FastCgiConfig, dns: Arc<crate::safety::Dns>, app: Arc<App>) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            target: cfg.target.clone(),
            dest: crate::upstream::dial::Dest {
                dns,
                policy: None,
                dns_budget: crate::safety::BUDGET.min(cfg.timeout),
            },
            waiting: Mutex::new(Vec::new()),
            next_ticket: std::sync::atomic::AtomicU64::new(0),
            places: Limit::new(cfg.max_conns),
            idle: Mutex::new(VecDeque::new()),
            released: tokio::sync::Notify::new(),
            connect_timeout: cfg.connect_timeout,
            keepalive_timeout: cfg.keepalive_timeout,
            app,
        });
        let mut all = pool.app.pools.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&pool));
        drop(all);
        pool
    }

    /// Whether a new generation's route with `cfg` reaches its application as this
    /// pool does: the same address, timeouts and resolver (`max_conns` may differ).
    fn reaches_like(&self, cfg: &FastCgiConfig, dns: &Arc<crate::safety::Dns>) -> bool {
        self.target == cfg.target
            && self.connect_timeout == cfg.connect_timeout
            && self.keepalive_timeout == cfg.keepalive_timeout
            && self.dest.dns_budget == crate::safety::BUDGET.min(cfg.timeout)
            && Arc::ptr_eq(&self.dest.dns, dns)
    }

    /// Its connections now.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            open: self.places.in_use(),
            idle: self.idle.lock().unwrap_or_else(|e| e.into_inner()).len(),
            waiting: self.waiting.lock().unwrap_or_else(|e| e.into_inner()).len(),
            max_conns: self.places.max(),
        }
    }

    /// An idle connection (unless `fresh`), else a new one, within the deadline.
    pub(crate) async fn acquire(&self, fresh: bool) -> Result<Conn, AcquireError> {
        let deadline =
            tokio::time::Instant::from_std(crate::clock::coarse()) + self.connect_timeout;
        if !fresh {
            if let Some(c) = self.idle_conn() {
                return Ok(c);
            }
        } else {
            // A fresh connection needs a place: an idle one gives its up.
            self.expire(Duration::ZERO);
        }
        let place = loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !fresh {
                if let Some(c) = self.idle_conn() {
                    return Ok(c);
                }
            }
            tokio::select! {
                p = self.places.acquire() => match p {
                    Some(p) => break p,
                    None => return Err(AcquireError::Busy),
                },
                // Idle connections hold their places: one coming back is one to take (or,
                // for a fresh connection, one to close for its place).
                _ = released => {
                    if fresh {
                        self.expire(Duration::ZERO);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(deadline) => return Err(AcquireError::Busy),
            }
        };
        // The proxy's dialer: every address a name resolves to, nodelay, local
        // exhaustion told apart; within what is left of the deadline.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (io, _) = crate::upstream::dial::connect(&self.target, &self.dest, left)
            .await
            .map_err(|e| AcquireError::Dial(e.to_string()))?
            .into_parts();
        Ok(Conn {
            io,
            _place: place,
            reused: false,
        })
    }

    /// The most recently returned idle connection that still looks open.
    fn idle_conn(&self) -> Option<Conn> {
        self.expire(self.keepalive_timeout);
        loop {
            let (mut c, _) = self
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_back()?;
            if c.looks_open() {
                c.reused = true;
                return Some(c);
            }
        }
    }

    /// Closes idle connections idle for `after` or more, oldest first.
    fn expire(&self, after: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while idle
            .front()
            .is_some_and(|(_, since)| crate::clock::age(*since) >= after)
        {
            idle.pop_front();
        }
    }

    /// A request sent: waiting for its first byte until [`Pool::answered`].
    pub(crate) fn sent(&self) -> u64 {
        let t = self
            .next_ticket
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((t, crate::clock::coarse()));
        t
    }

    /// The request with `ticket` got its first byte (or gave up).
    pub(crate) fn answered(&self, ticket: u64) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = w.iter().position(|(t, _)| *t == ticket) {
            w.swap_remove(i);
        }
    }

    /// A request waited [`STALL`] for its first byte: the idle connections, and the
    /// application workers they hold, are let go.
    pub(crate) fn shed_idle(&self) {
        // Every pool to the same application: routes have pools of their own, and one
        // route's idle connections may hold the workers another route waits for.
        let pools: Vec<Arc<Pool>> = self
            .app
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|w| w.upgrade())
            .filter(|p| p.target == self.target)
            .collect();
        let mut closed = 0;
        for p in pools {
            let shed = std::mem::take(&mut *p.idle.lock().unwrap_or_else(|e| e.into_inner()));
            closed += shed.len();
            drop(shed);
            p.released.notify_one();
        }
        if closed > 0 {
            tracing::debug!(
                "sluice: fastcgi: a request waits for a worker; closed {closed} idle connections"
            );
        }
    }

    fn stalled(&self) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(_, since)| crate::clock::age(*since) >= STALL)
    }

    /// A connection whose request ended cleanly, for the next one — unless a request
    /// is stalled waiting for a worker, which this connection then frees.
    pub(crate) fn release(&self, conn: Conn) {
        if self.stalled() {
            drop(conn);
            self.released.notify_one();
            return;
        }
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((conn, crate::clock::coarse()));
        self.released.notify_one();
    }
}

impl Conn {
    /// No byte and no close waiting on an idle connection.
    fn looks_open(&mut self) -> bool {
        crate::net::transport::is_quiet(&mut self.io)
    }

    /// Ready when the socket has bytes (or closed).
    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.io.poll_read_ready(cx)
    }

    /// Writes all of `b`; `sent` counts what the socket took, so a failure can tell
    /// "nothing left" from "some of it reached the application".
    pub(crate) async fn write_counted(&mut self, b: &[u8], sent: &mut u64) -> io::Result<()> {
        let mut at = 0;
        while at < b.len() {
            match self.io.write(&b[at..]).await? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => {
                    at += n;
                    *sent += n as u64;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        use std::future::Future as _;
        use tokio::io::AsyncReadExt as _;
        // Into the buffer's spare room, neither zeroed nor copied.
        crate::net::transport::make_room(buf, READ_CHUNK);
        std::pin::pin!(self.io.read_buf(buf)).poll(cx)
    }
}
