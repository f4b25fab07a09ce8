//! Idle backend connections, per peer: most recently used first (LIFO), at most
//! IDLE_MAX kept per worker, each closed after IDLE_TIMEOUT idle.
//!
//! Each worker thread (`workers N`) keeps its own list, on a cache line of its own: a
//! connection's socket is registered with the poller of the worker that opened it, so
//! a request taking it from its own worker's list has its reads and writes woken on
//! its own thread, and workers do not meet on one lock. A worker whose list is empty
//! takes one from another worker's list before dialling (the connection still works;
//! its wake-ups then cross threads), so a kept connection is never left unused while a
//! new one is opened beside it.
//!
//! Ours rather than hyper-util's pool because its rules are the product's (DESIGN.md
//! §8.12). A lock is held only to push or pop, never across an await.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::conn::BackendConn;
use crate::net::worker;

type List = Mutex<Vec<(BackendConn, Instant)>>;

/// One worker's list, alone on its cache line.
#[repr(align(128))]
#[derive(Default)]
struct Slot(List);

pub(crate) struct Idle {
    slots: Box<[Slot]>,
}

impl Default for Idle {
    fn default() -> Idle {
        Idle {
            slots: (0..worker::count()).map(|_| Slot::default()).collect(),
        }
    }
}

impl Idle {
    /// The most recently returned live connection, if one is fresh enough: this
    /// worker's first, then any other worker's.
    pub(crate) fn checkout(&self, idle_timeout: Duration) -> Option<BackendConn> {
        let n = self.slots.len();
        let own = worker::index() % n;
        (0..n).find_map(|k| checkout(&self.slots[(own + k) % n].0, idle_timeout))
    }

    pub(crate) fn checkin(&self, mut sender: BackendConn, idle_max: usize) {
        if idle_max == 0 {
            return;
        }
        sender.shrink();
        let slot = &self.slots[worker::index() % self.slots.len()];
        let mut list = slot.0.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < idle_max {
            list.push((sender, crate::clock::coarse()));
        }
    }

    /// Closes connections idle for `idle_timeout` or more (the oldest are first).
    pub(crate) fn reap(&self, idle_timeout: Duration) {
        for slot in self.slots.iter() {
            let mut list = slot.0.lock().unwrap_or_else(|e| e.into_inner());
            let expired = list
                .iter()
                .take_while(|(_, since)| crate::clock::age(*since) >= idle_timeout)
                .count();
            if expired > 0 {
                list.drain(..expired);
            }
        }
    }
}

/// The most recently returned live connection of `list`, if one is fresh enough.
fn checkout(list: &List, idle_timeout: Duration) -> Option<BackendConn> {
    loop {
        let mut conn = {
            let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
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
