//! Idle backend connections, per peer: most recently used first (LIFO), at most
//! IDLE_MAX kept, each closed after IDLE_TIMEOUT idle.
//!
//! Ours rather than hyper-util's pool because its rules are the product's (DESIGN.md
//! §8.12). The lock is per peer and held only to push or pop, never across an await.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::conn::BackendConn;

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
                if crate::clock::age(since) >= idle_timeout {
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

    pub(crate) fn checkin(&self, mut sender: BackendConn, idle_max: usize) {
        if idle_max == 0 {
            return;
        }
        sender.shrink();
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < idle_max {
            list.push((sender, crate::clock::coarse()));
        }
    }

    /// Closes connections idle for `idle_timeout` or more (the oldest are first).
    pub(crate) fn reap(&self, idle_timeout: Duration) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let expired = list
            .iter()
            .take_while(|(_, since)| crate::clock::age(*since) >= idle_timeout)
            .count();
        if expired > 0 {
            list.drain(..expired);
        }
    }
}
