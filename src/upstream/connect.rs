//! The upstream connector: the one way anything gets a connection to a peer.
//!
//! [`Pool::connect`] owns every rule of reaching a peer that is the pool's business
//! (DESIGN §8.12): HTTP/2 first where the scheme allows it (so a burst of requests
//! waits for one connection being opened instead of opening one each), an idle
//! HTTP/1.1 connection before a fresh one, what ALPN chose last on an `https://`
//! peer, and the success that brings a peer's breaker back. The proxy's attempts,
//! WebSocket upgrades and L4 relays all come here; none of them touches a peer's idle
//! list, HTTP/2 sessions or passive state. What an attempt's failure means for the
//! request (retry, failover evidence) stays with the caller, through
//! [`Pool::unreachable`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::conn::{BackendConn, Named};
use super::dial::{self, DialError};
use super::{h2, Lease, Pool, ALPN_H1, ALPN_H2};
use crate::config::BackendScheme;
use crate::stats::{bump, COUNTERS};

/// What a connection that carries bytes, not requests, is for ([`Pool::reach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Passage {
    /// An upgrade handshake: a fresh HTTP/1.1 connection (over TLS, `http/1.1` is the
    /// only protocol offered), never pooled.
    Upgrade,
    /// An L4 relay: a fresh connection to the peer's address, bytes only.
    Relay,
}

/// Why [`Pool::reach`] found no peer.
#[derive(Debug)]
pub(crate) enum Unreached {
    /// No peer may be tried (every one down, and `all_down fail`).
    AllDown,
    /// Every peer it could try failed to connect; the last one, for the log.
    Exhausted(Option<usize>),
    /// This host is out of ports or descriptors (counted and logged), dialling the
    /// peer named.
    Local(usize),
    /// The pool's scheme cannot carry it (logged), as the peer named found.
    Unsupported(usize),
}

/// A connection to a peer for a request.
pub(crate) enum Connection {
    /// An HTTP/1.1 connection; `reused`: it came from the idle list, so it may turn
    /// out closed before it takes a request.
    Http1 { conn: BackendConn, reused: bool },
    /// A stream on an HTTP/2 session.
    Http2(h2::Stream),
}

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The peer could not be reached (see [`Pool::unreachable`]).
    Unreachable(DialError),
    /// This host is out of ports or descriptors: not the peer's fault, counted and
    /// logged here (with the system's words), the peer's state unchanged.
    Local,
    /// The pool's scheme cannot carry what was wanted (an upgrade to an `h2c://` peer,
    /// which speaks HTTP/2 only): logged here.
    Unsupported,
}

impl Pool {
    /// A connection to peer `i` for a request, by the pool's rules (see the module);
    /// `fresh`: not an idle one (an idle one just turned out closed).
    pub(crate) async fn connect(&self, i: usize, fresh: bool) -> Result<Connection, ConnectError> {
        let peer = &self.peers()[i];
        loop {
            let mut opening = None;
            if self.h2_first(i) {
                match peer.mux.take() {
                    h2::Take::Stream(st) => {
                        if let Some(named) = st.named().filter(Named::expired) {
                            // Boxed: a lookup is a large future, and rare.
                            match Box::pin(self.reconfirmed(i, named)).await {
                                Some(renewed) => st.renew(renewed),
                                None => {
                                    st.retire();
                                    continue;
                                }
                            }
                        }
                        return Ok(Connection::Http2(st));
                    }
                    h2::Take::Wait(seen) => {
                        if !peer.mux.wait_opened(seen, self.cfg.connect_timeout).await {
                            return Err(ConnectError::Unreachable(DialError::Shared));
                        }
                        continue;
                    }
                    h2::Take::Open(guard) => opening = Some(guard),
                }
            }
            // A PROXY protocol header names one client: its connection is never shared.
            let shareable = self.cfg.proxy_protocol.is_none();
            if opening.is_none() && shareable && !fresh {
                if let Some(conn) = peer.idle.checkout(self.cfg.keepalive.idle_timeout) {
                    if conn.named.as_ref().is_none_or(|n| !n.expired()) {
                        return Ok(Connection::Http1 { conn, reused: true });
                    }
                    // Boxed: a lookup is a large future, and rare.
                    return Box::pin(self.reuse_renamed(i, conn)).await;
                }
            }
            return self.dial(i, opening).await;
        }
    }

    /// A fresh connection that carries bytes (an upgrade handshake, an L4 relay) to
    /// one of the pool's peers not in `tried`, and its lease (taken before the dial, as
    /// a request's is, so a dial in progress counts for `least_conn`): pick, connect; a
    /// peer that cannot be reached is marked and the next one tried — for an upgrade,
    /// at most `retries` more times (its handshake is a request's); a relay tries
    /// every peer. A failed trial of a recovering primary is failover evidence at once
    /// (it restarts the hold); otherwise a caller every peer failed records its last
    /// failure, once, and one that reached a peer records none.
    pub(crate) async fn reach(
        self: &Arc<Self>,
        passage: Passage,
        key: Option<u64>,
        tried: &mut super::Tried,
        note: &mut super::Note,
    ) -> Result<(BackendConn, Lease), Unreached> {
        let most = match passage {
            Passage::Upgrade => 1 + usize::from(self.cfg.retries),
            Passage::Relay => usize::MAX,
        };
        let mut failed = None;
        loop {
            let pick = match tried.count < most {
                true => self.pick(tried, key, note),
                false => super::Pick::Exhausted,
            };
            let i = match pick {
                super::Pick::Peer(i) => i,
                pick => {
                    if let Some(i) = failed {
                        self.failover_result(i, false, note);
                    }
                    return Err(match pick {
                        super::Pick::AllDown if tried.count == 0 => Unreached::AllDown,
                        _ => Unreached::Exhausted(failed),
                    });
                }
            };
            tried.add(i);
            let lease = Lease::new(self.clone(), i, None);
            // Boxed: a dial's state (a name lookup among it) would otherwise sit in
            // every caller's.
            let dialed = match passage {
                Passage::Relay => Box::pin(self.relay(i)).await,
                Passage::Upgrade => Box::pin(self.upgrade(i)).await,
            };
            match dialed {
                Ok(conn) => return Ok((conn, lease)),
                Err(ConnectError::Local) => return Err(Unreached::Local(i)),
                Err(ConnectError::Unsupported) => return Err(Unreached::Unsupported(i)),
                Err(ConnectError::Unreachable(e)) => {
                    if !self.unreachable(i, &e) {
                        continue;
                    }
                    if note.trial {
                        self.failover_result(i, false, note);
                        note.trial = false;
                    } else {
                        failed = Some(i);
                    }
                }
            }
        }
    }

    /// A kept HTTP/1.1 connection to peer `i` whose name's answer expired: reused if
    /// the name still points at it; else closed, and so on down the idle list, then a
    /// fresh connection.
    async fn reuse_renamed(
        &self,
        i: usize,
        mut conn: BackendConn,
    ) -> Result<Connection, ConnectError> {
        let peer = &self.peers()[i];
        loop {
            if let Some(named) = conn.named.as_deref_mut() {
                if named.expired() {
                    match self.reconfirmed(i, *named).await {
                        Some(renewed) => *named = renewed,
                        None => match peer.idle.checkout(self.cfg.keepalive.idle_timeout) {
                            Some(next) => {
                                conn = next;
                                continue;
                            }
                            None => return self.dial(i, None).await,
                        },
                    }
                }
            }
            return Ok(Connection::Http1 { conn, reused: true });
        }
    }

    /// Whether a kept connection to peer `i`, whose name's answer expired, may take
    /// another request (see [`dial::reconfirm`]): the renewed answer, or `None` — the
    /// caller closes it, and the next kept one (or a dial) meets the new answer.
    async fn reconfirmed(&self, i: usize, mut named: Named) -> Option<Named> {
        let peer = &self.peers()[i];
        match dial::reconfirm(&peer.addr.target, &self.dest, &mut named).await {
            Ok(()) => Some(named),
            Err(why) => {
                tracing::debug!(
                    pool = self.name(),
                    peer = %peer.addr.text,
                    "sluice: {}: closed a kept connection to {} ({}): {why}",
                    self.name(),
                    peer.addr.text,
                    named.ip
                );
                None
            }
        }
    }

    /// Whether peer `i` is tried over HTTP/2 first: always for `h2c://`; for an
    /// `https://` peer, unless ALPN chose `http/1.1` last time (so a burst of requests
    /// to a peer whose choice is not known yet waits for one connection).
    fn h2_first(&self, i: usize) -> bool {
        match self.state.scheme {
            BackendScheme::Http => false,
            BackendScheme::H2c => true,
            BackendScheme::Https => self.peers()[i].alpn.load(Ordering::Relaxed) != ALPN_H1,
        }
    }

    /// A fresh connection to peer `i` for a request; `opening`: this request opens the
    /// peer's next HTTP/2 session, which the requests waiting for it learn the fate of.
    async fn dial(
        &self,
        i: usize,
        opening: Option<h2::Opening<'_>>,
    ) -> Result<Connection, ConnectError> {
        let peer = &self.peers()[i];
        let scheme = self.state.scheme;
        // Boxed: the TLS and HTTP/2 handshakes make a large future, which would
        // otherwise make every request's future as large (and copied as often).
        let dialed = Box::pin(dial::connect_peer(
            &peer.addr.target,
            scheme,
            self.state.tls.as_deref(),
            &self.dest,
            self.cfg.connect_timeout,
            false,
            &peer.addr.text,
        ))
        .await;
        match dialed {
            Ok(dial::Dialed::H1(conn)) => {
                if scheme == BackendScheme::Https {
                    peer.alpn.store(ALPN_H1, Ordering::Relaxed);
                }
                // Waiters look again, and find the peer speaks HTTP/1.1.
                drop(opening);
                peer.passive.record_success();
                Ok(Connection::Http1 {
                    conn,
                    reused: false,
                })
            }
            Ok(dial::Dialed::H2(session)) => {
                peer.passive.record_success();
                peer.alpn.store(ALPN_H2, Ordering::Relaxed);
                Ok(Connection::Http2(match opening {
                    Some(guard) => guard.opened(session),
                    None => peer.mux.adopt(session),
                }))
            }
            Err(e) => {
                if let Some(guard) = opening {
                    guard.failed();
                }
                Err(self.dial_failed(i, e))
            }
        }
    }

    /// A fresh HTTP/1.1 connection to peer `i` for an upgrade handshake.
    async fn upgrade(&self, i: usize) -> Result<BackendConn, ConnectError> {
        let peer = &self.peers()[i];
        if self.state.scheme == BackendScheme::H2c {
            tracing::info!(
                pool = self.name(),
                peer = %peer.addr.text,
                "sluice: {}: cannot pass a websocket upgrade to {}: it speaks HTTP/2 only (h2c://)",
                self.name(),
                peer.addr.text
            );
            return Err(ConnectError::Unsupported);
        }
        let dialed = dial::connect_peer(
            &peer.addr.target,
            self.state.scheme,
            self.state.tls.as_deref(),
            &self.dest,
            self.cfg.connect_timeout,
            true,
            &peer.addr.text,
        )
        .await;
        match dialed {
            Ok(dial::Dialed::H1(conn)) => {
                peer.passive.record_success();
                Ok(conn)
            }
            Ok(dial::Dialed::H2(_)) => {
                // Offered http/1.1 only: a backend that chose h2 anyway broke ALPN.
                let why = "the backend chose h2 though only http/1.1 was offered";
                Err(self.dial_failed(i, DialError::Tls(why.into())))
            }
            Err(e) => Err(self.dial_failed(i, e)),
        }
    }

    /// A fresh bare connection to peer `i`, for an L4 relay.
    async fn relay(&self, i: usize) -> Result<BackendConn, ConnectError> {
        let peer = &self.peers()[i];
        match dial::connect(&peer.addr.target, &self.dest, self.cfg.connect_timeout).await {
            Ok(conn) => {
                peer.passive.record_success();
                Ok(conn)
            }
            Err(e) => Err(self.dial_failed(i, e)),
        }
    }

    /// A dial that failed: local exhaustion is counted and logged here; a TLS failure
    /// is logged (its words say what an operator must fix).
    fn dial_failed(&self, i: usize, e: DialError) -> ConnectError {
        let peer = &self.peers()[i].addr.text;
        match e {
            DialError::Local(e) => {
                bump(&COUNTERS.out_of_ports);
                tracing::warn!(
                    pool = self.name(),
                    peer = %peer,
                    "sluice: {}: cannot dial {peer}: {e}; out of local capacity, backend state unchanged",
                    self.name(),
                );
                ConnectError::Local
            }
            e => {
                if let DialError::Tls(why) = &e {
                    tracing::warn!(pool = self.name(), peer = %peer, "sluice: {}: {peer}: {why}", self.name());
                }
                ConnectError::Unreachable(e)
            }
        }
    }

    /// An attempt that could not reach peer `i`: the peer's failure (its breaker) —
    /// unless another request's dial failed and counted it already. Whether it is
    /// failover evidence (`true`: counted at once by the caller).
    pub(crate) fn unreachable(&self, i: usize, e: &DialError) -> bool {
        if matches!(e, DialError::Shared) {
            return false;
        }
        self.peer_failed(i, e.kind(), e);
        true
    }
}

impl Lease {
    /// A response that ended cleanly gives its HTTP/1.1 connection back for the next
    /// request to this peer.
    pub(crate) fn give_back(&self, conn: BackendConn) {
        let pool = &self.pool;
        if pool.cfg.proxy_protocol.is_some() {
            return;
        }
        pool.peers()[self.peer]
            .idle
            .checkin(conn, pool.cfg.keepalive.idle_max);
    }
}
