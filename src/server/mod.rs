//! Listeners: bind, accept, tell HTTP/1.1 from HTTP/2 prior knowledge, and hand each
//! connection to its loop over the transport seam (`transport`). Owns graceful
//! shutdown (`drain`) and the process's life (`lifecycle`).
//!
//! Never blocks the runtime; an accept error (out of descriptors) is logged and
//! retried after a pause rather than spinning.

mod beside;
pub(crate) mod conn;
pub(crate) mod drain;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod h3;
pub mod handover;
mod idle;
pub mod lifecycle;
mod listeners;
mod stall;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::time::{timeout_at, Instant};

use self::drain::Drain;
use crate::clock::OneReading;
use crate::config::Listen;
use crate::net::transport::Transport;
use crate::pipeline::{ClientInfo, Scheme};
use crate::runtime::Live;

/// A listener that could not be bound, and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// The address as written.
    pub addr: String,
    #[source]
    pub source: std::io::Error,
}

fn bind_one(l: &Listen) -> std::io::Result<TcpListener> {
    crate::net::bind_tcp(l.addr, l.dual_stack)
}

/// A TCP TLS listener's `Alt-Svc` value, present while a `quic` listener shares its
/// address (a reload may add or remove that one).
pub(crate) type AltSvc = Arc<arc_swap::ArcSwapOption<http::HeaderValue>>;

/// What a listener's connections start with: TLS, and before it a PROXY protocol
/// header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Front {
    pub tls: bool,
    pub proxy_protocol: bool,
}

/// How an accept loop shares its thread with the connections it took: after every
/// [`Self::BATCH`] connections it yields. On the current-thread runtime (`workers 1`)
/// tokio defers that wake past the I/O driver's next turn, so the connections taken run
/// until they wait (most for their backend) and those already answered finish before
/// more are taken (nginx takes one an event loop turn); on the multi-thread runtime the
/// wake comes when the worker runs out of local work or at its maintenance tick.
/// Without it, a listener with a full backlog was drained (up to tokio's budget, 128)
/// before any of its connections ran, each holding its task, buffers and backend
/// exchange at once: at 256 clients opening a connection a request, ~200 misses of a
/// 512 KiB cache a request, and mimalloc giving pages back (`madvise`) for the next
/// batch to touch again (docs/performance.md, eighteenth part).
#[derive(Debug, Default)]
pub(crate) struct Pace(u32);

impl Pace {
    /// Connections taken between two yields: few enough to keep the working set small,
    /// enough that the yield's own cost (a turn of the I/O driver) is spread thin (one
    /// cost 1,300 instructions a connection more; 4 and 16 no more than no pacing).
    const BATCH: u32 = 16;

    /// Counts a connection about to be taken, and yields after a batch.
    pub(crate) async fn taken(&mut self) {
        self.0 += 1;
        if self.0 == Self::BATCH {
            self.0 = 0;
            tokio::task::yield_now().await;
        }
    }
}

/// What an accept loop takes its connections through: one at a time, paced ([`Pace`]),
/// until shutdown starts or `close` is notified (a reload removed the listener).
pub(crate) struct Taking {
    /// Made once for the listener's life, not once a connection (their making, polling
    /// and dropping cost ~280 instructions an accept). `close` is a `notify_one`: one
    /// sent while the loop yields or works wakes this waiter all the same.
    stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    pace: Pace,
}

impl Taking {
    pub(crate) fn new(drain: &Drain, close: Arc<tokio::sync::Notify>) -> Self {
        let mut watch = drain.watch();
        let stop = async move {
            tokio::select! {
                _ = watch.closing() => {}
                _ = close.notified() => {}
            }
        };
        Taking {
            stop: Box::pin(stop),
            pace: Pace::default(),
        }
    }

    /// The next connection on `listener`, or `None` once told to stop. An accept error
    /// (most often out of descriptors) is logged, naming the listener as `what` says,
    /// and waited out for 100 ms.
    pub(crate) async fn next(
        &mut self,
        listener: &TcpListener,
        what: impl Fn() -> String,
    ) -> Option<(tokio::net::TcpStream, SocketAddr)> {
        self.pace.taken().await;
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => return Some(x),
                    Err(e) => {
                        tracing::warn!("sluice: accept failed on {}: {e}; pausing 100ms", what());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = self.stop.as_mut() => return None,
            }
        }
    }
}

/// An HTTP listener's loop; `configured` is its address as the config writes it
/// (where its `allow`/`deny`/`rate_limit` are found). Accepts until shutdown starts or
/// `close` is notified (a reload removed it); then the listener is dropped, which
/// closes it. Connections already accepted are not touched.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn accept_loop(
    listener: TcpListener,
    configured: SocketAddr,
    live: Arc<Live>,
    drain: Drain,
    close: Arc<tokio::sync::Notify>,
    access: conn::Access,
    front: Front,
    alt_svc: Option<AltSvc>,
) {
    // The address clients reach: a PROXY protocol header's destination. A wildcard
    // listener looks each connection's up while some pool sends headers (else its
    // own address, `0.0.0.0:PORT`, stands).
    let bound = listener.local_addr().ok();
    let wildcard = bound.is_some_and(|a| a.ip().is_unspecified());
    let mut taking = Taking::new(&drain, close);
    let what = || bound.map(|a| a.to_string()).unwrap_or_default();
    while let Some((stream, client)) = taking.next(&listener, what).await {
        let gen = live.load();
        if let Some(g) = gen.listen_guards(configured) {
            if !g.admits(client.ip().to_canonical()) {
                // `allow`/`deny`/`rate_limit` refused it: closed at once, counted.
                tracing::debug!("sluice: {}: refused a connection from {client}", g.name);
                drop(stream);
                continue;
            }
        }
        // Counted before the task runs, so a drain starting now waits for it.
        let counted = drain.connection();
        let local = match wildcard && gen.sends_proxy_protocol {
            true => stream.local_addr().ok().or(bound),
            false => bound,
        };
        if !front.tls && !front.proxy_protocol {
            let mut client = ClientInfo::new(client, Scheme::Http);
            client.local = local;
            let (live, access) = (live.clone(), access.clone());
            spawn_connection(|| connection(stream, client, live, counted, access, false));
        } else {
            tokio::spawn(front_door(
                stream,
                client,
                local,
                front,
                live.clone(),
                counted,
                access.clone(),
                alt_svc.as_ref().and_then(|a| a.load_full()),
            ));
        }
    }
}

/// A connection to a TLS or `proxy_protocol` listener: its PROXY header, then its
/// handshake, then the HTTP connection. `alt_svc`: what its responses advertise.
#[allow(clippy::too_many_arguments)]
async fn front_door(
    mut stream: tokio::net::TcpStream,
    mut client: SocketAddr,
    local: Option<SocketAddr>,
    front: Front,
    live: Arc<Live>,
    counted: drain::ConnectionGuard,
    access: conn::Access,
    alt_svc: Option<Arc<http::HeaderValue>>,
) {
    if front.proxy_protocol {
        match proxied(&live, &mut stream, client).await {
            Some(named) => client = named,
            None => return,
        }
    }
    if !front.tls {
        let mut client = ClientInfo::new(client, Scheme::Http);
        client.local = local;
        // A task of its own: this one's state (the handshake's, the arguments) is not
        // carried by the connection for its whole life.
        spawn_connection(|| connection(stream, client, live, counted, access, false));
        return;
    }
    // The certificates of the generation current at accept time.
    let gen = live.load();
    let Some(certs) = gen.tls.as_ref() else {
        return;
    };
    let mut watch = counted.drain().watch();
    let done = tokio::select! {
        h = tls::accept(certs, stream) => h,
        _ = watch.draining() => None,
    };
    drop(gen);
    if let Some(h) = done {
        let mut client = ClientInfo::new(client, Scheme::Https);
        client.tls_client = h.client;
        client.tls = Some(h.version);
        client.local = local;
        client.alt_svc = alt_svc;
        spawn_connection(|| connection(h.conn, client, live, counted, access, h.h2));
    }
}

/// On a `proxy_protocol` listener: the client its PROXY header names (the peer itself
/// for `LOCAL`, `0.0.0.0` for `UNKNOWN`), taken off the stream before anything else
/// reads it. `None` (counted,
/// logged at debug): the peer is not in `trust`, or its header is missing, malformed
/// or late; the connection is then closed without an answer.
async fn proxied(
    live: &Live,
    stream: &mut tokio::net::TcpStream,
    peer: SocketAddr,
) -> Option<SocketAddr> {
    let trusted = {
        let gen = live.load();
        let ip = peer.ip().to_canonical();
        gen.trust.iter().any(|n| n.contains(&ip))
    };
    let why = if trusted {
        match crate::net::proxy_protocol::read(stream).await {
            Ok(source) => return Some(source.unwrap_or(peer)),
            Err(why) => why,
        }
    } else {
        "the peer is not in `trust`".to_string()
    };
    crate::stats::bump(&crate::stats::COUNTERS.proxy_protocol_refusals);
    tracing::debug!("sluice: closed a connection from {peer} on a proxy_protocol listener: {why}");
    None
}

/// Runs the [`connection`] `make` makes as a task of its own, its state made in a box
/// of its own ([`crate::inplace`]): the task then holds a pointer, and spawning it and
/// storing its end copy a few bytes rather than the whole state (about 700
/// instructions a connection, callgrind).
fn spawn_connection<F>(make: impl FnOnce() -> F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(OneReading::new(crate::inplace::boxed(make)));
}

/// One client connection's task: waits for its first bytes (no buffer until then),
/// sniffs the protocol (HTTP/2 by ALPN or by its preface, else HTTP/1.1) and runs the
/// h1 or h2 loop. Shutdown closes it at once while it has not sent a whole head.
/// Not inlined, so that [`spawn_connection`] makes its state in the box.
#[inline(never)]
fn connection<S: Transport>(
    stream: S,
    client: ClientInfo,
    live: Arc<Live>,
    counted: drain::ConnectionGuard,
    access: conn::Access,
    alpn_h2: bool,
) -> impl std::future::Future<Output = ()> {
    let watch = counted.watch();
    let mut conn = h1::Conn {
        client,
        live,
        counted,
        watch,
        access,
    };
    let mut stream = stream;
    // A block, not an `async fn`: its captures are used in place (an `async fn` moves
    // its arguments into locals, and the task would carry both).
    async move {
        // Made in a block: what it takes (the first bytes, the time) is not kept in the
        // task beside the connection loop.
        let serving = {
            let accepted = Instant::now();
            // ALPN chose HTTP/2: no sniffing, the preface is h2's to read.
            let buf = match alpn_h2 {
                true => bytes::BytesMut::new(),
                false => match first_bytes(&mut conn, &mut stream, accepted).await {
                    Some(buf) => buf,
                    None => return,
                },
            };
            if alpn_h2 || buf.starts_with(h2::PREFACE) {
                return h2_boxed(conn, stream, buf).await;
            }
            conn.serve(&mut stream, buf, accepted)
        };
        serving.await;
    }
}

/// A new connection's first bytes: enough to tell HTTP/2's preface from an HTTP/1
/// request line. `None`: the client left or was silent for `HEAD_TIMEOUT`, or sluice
/// is shutting down.
async fn first_bytes<S: Transport>(
    conn: &mut h1::Conn,
    stream: &mut S,
    accepted: Instant,
) -> Option<bytes::BytesMut> {
    let wheel = conn.counted.wheel();
    let buf = wheel.wait(stream, conn::HEAD_TIMEOUT).await?;
    if buf.len() >= h2::PREFACE.len() || !h2::PREFACE.starts_with(&buf) {
        return Some(buf);
    }
    let deadline = accepted + conn::HEAD_TIMEOUT;
    Box::pin(sniff(stream, &mut conn.watch, buf, deadline)).await
}

/// The HTTP/2 loop, boxed (and made outside the `async fn`): an HTTP/1 connection's
/// task should not be as large as an h2 one's.
fn h2_boxed<S: Transport>(
    conn: h1::Conn,
    stream: S,
    buf: bytes::BytesMut,
) -> std::pin::Pin<Box<impl std::future::Future<Output = ()>>> {
    let drain = conn.counted.drain();
    let h1::Conn {
        client,
        live,
        counted,
        watch,
        access,
    } = conn;
    Box::pin(async move {
        h2::serve(stream, buf.freeze(), client, live, drain, watch, access).await;
        drop(counted);
    })
}

/// The rest of a new connection's first bytes, when they began like HTTP/2's
/// preface (boxed where it is called: it is seldom needed).
async fn sniff<S: Transport>(
    stream: &mut S,
    watch: &mut drain::Watch,
    mut buf: bytes::BytesMut,
    deadline: Instant,
) -> Option<bytes::BytesMut> {
    let rest = async {
        while buf.len() < h2::PREFACE.len() && h2::PREFACE.starts_with(&buf) {
            match timeout_at(deadline, stream.read_buf(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
        Some(buf)
    };
    tokio::select! {
        b = rest => b,
        _ = watch.draining() => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live generation of a config's text.
    fn live(text: &str) -> Arc<Live> {
        let c = crate::config::load_text("t.conf", text).unwrap().config;
        Live::new(crate::runtime::Generation::compile(&c, None))
    }

    /// A full backlog is not all taken before the connections taken run: 100 clients
    /// wait with their requests sent (fewer than tokio's budget of 128, which alone
    /// would stop an unpaced loop), and the first is answered while some of them are
    /// still waiting to be taken.
    #[tokio::test]
    async fn a_full_backlog_is_answered_while_it_is_taken() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let text = "site * { respond 200 \"ok\" }";
        let live = live(text);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..100 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .unwrap();
            clients.push(s);
        }
        let (drain, close) = (Drain::new(), Arc::new(tokio::sync::Notify::new()));
        let access: conn::Access = Arc::new(arc_swap::ArcSwapOption::empty());
        let front = Front {
            tls: false,
            proxy_protocol: false,
        };
        let (d, c) = (drain.clone(), close.clone());
        let task = tokio::spawn(accept_loop(l, addr, live, d, c, access, front, None));
        let mut buf = [0u8; 64];
        let read = clients[0].read(&mut buf);
        let n = tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the first client was answered")
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        let taken = drain.connections();
        assert!(
            taken < 100,
            "all {taken} were taken before the first was answered"
        );
        close.notify_one();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
    }

    /// An accept loop lets its connections run after each batch: the batch's last
    /// `taken` waits for the runtime's turn, the ones before it go straight on, and the
    /// count starts again.
    #[tokio::test]
    async fn pace_yields_after_each_batch() {
        use std::future::Future;
        let mut pace = Pace::default();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for batch in 0..3 {
            for i in 1..=Pace::BATCH {
                let mut taken = std::pin::pin!(pace.taken());
                let waited = taken.as_mut().poll(&mut cx).is_pending();
                assert_eq!(waited, i == Pace::BATCH, "batch {batch}, connection {i}");
                if waited {
                    taken.await;
                }
            }
        }
    }

    /// What an idle keep-alive connection costs is mostly its task, and the task is
    /// this future: an await that is not boxed, or an `async fn` keeping its
    /// arguments twice, shows here first. (640 bytes of tokio task at this size; the
    /// socket's registration is tokio's 256 more.)
    #[tokio::test]
    async fn an_http1_connection_task_stays_small() {
        let text = "site a { proxy 127.0.0.1:1 }";
        let live = live(text);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let access: conn::Access = Arc::new(arc_swap::ArcSwapOption::empty());
        let client = ClientInfo::new(l.local_addr().unwrap(), Scheme::Http);
        let drain = Drain::new();
        let task = connection(s, client, live, drain.connection(), access, false);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 480, "a connection's task grew to {size} bytes");
    }
}
