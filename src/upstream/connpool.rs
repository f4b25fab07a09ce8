//! Idle backend connections, per peer: most recently used first (LIFO), at most
//! IDLE_MAX kept, each closed after IDLE_TIMEOUT idle.
//!
//! Ours rather than hyper-util's pool because its rules are the product's (DESIGN.md
//! §8.12). The lock is per peer and held only to push or pop, never across an await.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::conn::BackendConn;

/// How many of a peer's idle connections keep their read and write buffers: a
/// connection taken again at once reuses its buffer (the allocation, and the buffer's
/// first split, cost about 400 instructions a request), and the memory they hold stays
/// bounded (16 KiB each at most, per peer).
const HOT: usize = 8;

#[derive(Default)]
pub(crate) struct Idle {
    list: Mutex<Vec<(BackendConn, Instant)>>,
}

impl Idle {
    /// The most recently returned live connection, if one is fresh enough.
    pub(crate) fn checkout(&self, idle_timeout: Duration) -> Option<BackendConn> {
        loop {
            let mut conn = {
                let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
                let (conn, since) = list.pop()?;
                if since.elapsed() >= idle_timeout {
                    // Everything below is older still.
                    list.clear();
                    return None;
                }
                conn
            };
            if conn.is_reusable() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for reuse. The [`HOT`] most recently returned keep their buffers
    /// (the next request reuses them); one pushed deeper gives its buffers back.
    pub(crate) fn checkin(&self, conn: BackendConn, idle_max: usize) {
        if idle_max == 0 {
            return;
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < idle_max {
            list.push((conn, Instant::now()));
            // Every connection deeper than HOT passed this depth on a push, so none
            // below it holds buffers.
            if let Some(i) = list.len().checked_sub(HOT + 1) {
                list[i].0.shrink();
            }
        }
    }

    /// Closes connections idle for `idle_timeout` or more (the oldest are first).
    pub(crate) fn reap(&self, idle_timeout: Duration) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let expired = list
            .iter()
            .take_while(|(_, since)| since.elapsed() >= idle_timeout)
            .count();
        if expired > 0 {
            list.drain(..expired);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::stream::Stream;

    /// However connections come and go, none deeper than HOT in the idle list holds
    /// buffers, and the one just returned (the next one taken) keeps its own.
    #[tokio::test]
    async fn only_the_hot_connections_keep_buffers() {
        let path = std::env::temp_dir().join(format!("sluice-idle-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let _listener = tokio::net::UnixListener::bind(&path).unwrap();
        let mut conns = Vec::new();
        for _ in 0..HOT * 3 {
            let s = tokio::net::UnixStream::connect(&path).await.unwrap();
            conns.push(BackendConn::new(Stream::Unix(s)));
        }
        let _ = std::fs::remove_file(&path);
        let idle = Idle::default();
        let check = |idle: &Idle| {
            let list = idle.list.lock().unwrap();
            let n = list.len();
            for (i, (c, _)) in list.iter().enumerate() {
                assert!(i + HOT >= n || !c.holds_buffers(), "depth {} of {n}", n - i);
            }
            assert!(list.last().unwrap().0.holds_buffers(), "the last returned");
        };
        for mut c in conns {
            c.take_buffers();
            idle.checkin(c, 1000);
            check(&idle);
        }
        // Take some and give them back, as requests do (each uses its buffer).
        for round in 0..HOT * 2 {
            let taken: Vec<_> = (0..round % 5 + 1)
                .map(|_| idle.list.lock().unwrap().pop().unwrap().0)
                .collect();
            for mut c in taken {
                c.take_buffers();
                idle.checkin(c, 1000);
                check(&idle);
            }
        }
    }
}
