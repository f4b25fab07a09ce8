//! Log lines a client can cause at will (a refused handshake, a request the HTTP/2
//! library will not send): at most one WARN a minute per kind, the next one saying how
//! many were folded; the rest go to DEBUG. One atomic pair per kind, no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// How long after a WARN of one kind the next is folded.
const WINDOW_SECS: u64 = 60;

/// One kind of client-caused line.
pub(crate) struct Throttled {
    /// Seconds since the process's first throttled line, plus one, of the last WARN
    /// (0: none yet).
    last: AtomicU64,
    folded: AtomicU64,
}

impl Throttled {
    pub(crate) const fn new() -> Throttled {
        Throttled {
            last: AtomicU64::new(0),
            folded: AtomicU64::new(0),
        }
    }

    /// `Some(folded)` when a WARN may be written at `now` (seconds, from 1).
    fn allow(&self, now: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        if (last != 0 && now < last + WINDOW_SECS)
            || self
                .last
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            self.folded.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.folded.swap(0, Ordering::Relaxed))
    }

    /// Writes `msg` as a WARN, unless one of this kind went out within the minute.
    pub(crate) fn warn(&self, msg: std::fmt::Arguments<'_>) {
        static START: OnceLock<Instant> = OnceLock::new();
        let now = START.get_or_init(Instant::now).elapsed().as_secs() + 1;
        match self.allow(now) {
            Some(0) => tracing::warn!("{msg}"),
            Some(n) => tracing::warn!("{msg} (and {n} more like it in the last minute)"),
            None => tracing::debug!("{msg}"),
        }
    }
}

/// An HTTP/2 WebSocket handshake a backend answered without switching protocols.
pub(crate) static H2_WEBSOCKET_REFUSED: Throttled = Throttled::new();
/// A request the HTTP/2 library refused to send to a backend (its fields break HTTP/2).
pub(crate) static H2_UNSENDABLE: Throttled = Throttled::new();
/// A `tcp` listener at its `max_conns`.
pub(crate) static TCP_MAX_CONNS: Throttled = Throttled::new();
/// A `quic` listener at its connection limit.
pub(crate) static QUIC_FULL: Throttled = Throttled::new();
/// A health probe this host had no port or descriptor for.
pub(crate) static PROBE_OUT_OF_CAPACITY: Throttled = Throttled::new();
/// An extended CONNECT for a protocol other than WebSocket.
pub(crate) static H2_CONNECT_PROTOCOL: Throttled = Throttled::new();
/// Request bodies held for `body_deny` reached their process-wide budget.
pub(crate) static BODY_HOLD_FULL: Throttled = Throttled::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_minute_then_the_count_of_those_folded() {
        let t = Throttled::new();
        assert_eq!(t.allow(1), Some(0), "the first goes out");
        assert_eq!(t.allow(2), None);
        assert_eq!(t.allow(60), None);
        assert_eq!(t.allow(61), Some(2), "a minute later, with the two folded");
        assert_eq!(t.allow(62), None);
    }
}
