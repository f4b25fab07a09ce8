//! The wait of a kept-alive connection for its next request, without a timer of its
//! own.
//!
//! A timer per idle connection (tokio's `Sleep`: 112 bytes in every connection's task,
//! registered in the worker's timer wheel and cancelled again for every request) was a
//! large part of what an idle connection cost. Here idle connections share one-second
//! buckets instead: a connection whose idle time ends in second `s` (counted from the
//! wheel's start) waits on bucket `s % BUCKETS`, and one sweeper task wakes each bucket
//! when its second has come. A woken connection closes when its deadline has passed and
//! waits again otherwise (a bucket is shared by the seconds `BUCKETS` apart). The
//! drain's start wakes every bucket. Deadlines are kept to the second: a connection
//! idle for 60 s closes within 61 s.
//!
//! Each bucket has a shard per worker thread (by the thread a connection goes idle
//! on), each on a cache line of its own, so connections going idle in the same second
//! on different threads neither meet on one lock nor pass a cache line back and forth.
//! The sweeper wakes once a second while the process runs and ends with the wheel.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::net::transport::{wait_first_bytes, Transport};

/// More seconds than the longest idle wait, so a bucket never wakes a connection a
/// whole turn early.
const BUCKETS: usize = 64;
/// Locks per bucket: threads past this many share them.
const SHARDS: usize = 8;

/// A bucket's shard, alone on its cache line.
#[repr(align(128))]
struct Shard(Notify);

std::thread_local! {
    /// This thread's shard in every bucket.
    static THREAD_SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

pub(crate) struct Wheel {
    start: Instant,
    buckets: Box<[Shard]>,
    sweeping: AtomicBool,
    draining: AtomicBool,
    /// Set by an upgrade: connections end after their current response, but one that
    /// waits for its next request goes on waiting.
    closing: AtomicBool,
}

impl Wheel {
    pub(crate) fn new() -> Arc<Wheel> {
        Arc::new(Wheel {
            start: Instant::now(),
            buckets: (0..BUCKETS * SHARDS)
                .map(|_| Shard(Notify::new()))
                .collect(),
            sweeping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        })
    }

    /// Wakes every idle connection, for good: each closes.
    pub(crate) fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.buckets.iter().for_each(|s| s.0.notify_waiters());
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// From now on, connections end after their current response.
    pub(crate) fn close_after_response(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Whether a response should say `Connection: close` and end its connection.
    pub(crate) fn ends_keep_alive(&self) -> bool {
        self.closing.load(Ordering::Relaxed) || self.draining.load(Ordering::Relaxed)
    }

    /// Waits for the first bytes of the next request on `stream`, for at most
    /// `timeout` (kept to the second, `timeout` < `BUCKETS` seconds). `None`: the
    /// client closed, the time passed, or the drain started.
    pub(crate) fn wait<'a, S: Transport>(
        self: &'a Arc<Self>,
        stream: &'a S,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Option<BytesMut>> + 'a {
        debug_assert!(timeout < Duration::from_secs(BUCKETS as u64));
        self.sweep_started();
        let deadline = Instant::from_std(crate::clock::coarse()) + timeout;
        let shard = THREAD_SHARD.with(|s| *s);
        let bucket = &self.buckets[self.second(deadline) % BUCKETS * SHARDS + shard].0;
        // A block, not an `async fn`: the arguments are not kept twice in every idle
        // connection's task.
        async move {
            loop {
                // Made before the checks: a wake between them and the wait is not lost.
                let woken = bucket.notified();
                if self.is_draining() {
                    return None;
                }
                tokio::select! {
                    biased;
                    r = wait_first_bytes(stream) => return r.ok(),
                    () = woken => {}
                }
                if Instant::from_std(crate::clock::coarse()) >= deadline {
                    return None;
                }
            }
        }
    }

    /// The first whole second, counted from the start, at or after `t`: when the
    /// sweeper wakes the bucket of a deadline at `t`.
    fn second(&self, t: Instant) -> usize {
        let d = t.saturating_duration_since(self.start);
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)) as usize
    }

    fn sweep_started(self: &Arc<Self>) {
        if !self.sweeping.load(Ordering::Relaxed) && !self.sweeping.swap(true, Ordering::AcqRel) {
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }
}

/// Wakes each bucket when its second comes (a late sweep wakes the ones it missed),
/// until the wheel is dropped.
async fn sweep(wheel: Weak<Wheel>) {
    let mut next = 1;
    loop {
        let Some(start) = wheel.upgrade().map(|w| w.start) else {
            return;
        };
        tokio::time::sleep_until(start + Duration::from_secs(next as u64)).await;
        let Some(w) = wheel.upgrade() else {
            return;
        };
        let now = w.start.elapsed().as_secs() as usize;
        for second in next.max(now.saturating_sub(BUCKETS - 1))..=now {
            let first = second % BUCKETS * SHARDS;
            w.buckets[first..first + SHARDS]
                .iter()
                .for_each(|s| s.0.notify_waiters());
        }
        next = now + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        (client, server)
    }

    fn bounded<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
        tokio::time::timeout(Duration::from_secs(10), f)
    }

    #[tokio::test]
    async fn the_idle_time_ends_the_wait_to_the_second() {
        let wheel = Wheel::new();
        let (_client, server) = pair().await;
        let began = Instant::now();
        let got = bounded(wheel.wait(&server, Duration::from_secs(2))).await;
        assert!(got.expect("the wait ended").is_none());
        let waited = began.elapsed();
        assert!(waited >= Duration::from_secs(2), "closed early: {waited:?}");
        assert!(waited < Duration::from_secs(4), "closed late: {waited:?}");
    }

    // Two workers: a wait may be made on one thread and woken or dropped on another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_end_the_wait_each_time() {
        let wheel = Wheel::new();
        let (mut client, mut server) = pair().await;
        for round in 0..3u8 {
            let send = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                client.write_all(&[b'a' + round]).await.unwrap();
            };
            let (got, ()) =
                bounded(async { tokio::join!(wheel.wait(&server, Duration::from_secs(30)), send) })
                    .await
                    .unwrap();
            assert_eq!(&got.expect("bytes")[..], &[b'a' + round]);
            // The socket is quiet again: nothing was left unread.
            let mut byte = [0u8; 1];
            let more = tokio::time::timeout(Duration::from_millis(20), server.read(&mut byte));
            assert!(more.await.is_err());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_client_and_the_drain_end_the_wait() {
        let wheel = Wheel::new();
        let (client, server) = pair().await;
        drop(client);
        let got = bounded(wheel.wait(&server, Duration::from_secs(30))).await;
        assert!(got.expect("the wait ended").is_none());

        let (_client, server) = pair().await;
        let drain = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            wheel.drain();
        };
        let both = async { tokio::join!(wheel.wait(&server, Duration::from_secs(30)), drain) };
        let (got, ()) = bounded(both).await.expect("the drain woke it");
        assert!(got.is_none());
        // Once draining, a new wait ends at once.
        let (_client, server) = pair().await;
        assert!(bounded(wheel.wait(&server, Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none());
    }
}
