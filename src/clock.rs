//! The process clock: milliseconds since start, small enough for an atomic, so peer
//! state, buckets and timers compare times without locks; the wall-clock time of a
//! reading, for what an operator reads; and one reading shared by everything a task
//! does in one poll ([`OneReading`], [`coarse`]). A leaf: imports nothing of the crate.
//!
//! Why a shared reading: a proxied request asked the clock five times (the idle wait's
//! deadline, the peer pick, the pooled connection's age, the response timer, the
//! connection's return to the pool), each `clock_gettime` about 20 ns here — more than
//! the instructions around it. nginx reads the clock once per turn of its event loop;
//! tokio has no hook for every turn (a busy loop polls without parking), so the turn
//! here is one poll of a connection's task: the first [`coarse`] of the poll reads the
//! clock, the rest of the poll reuses it. A poll runs for microseconds (tokio's
//! cooperative budget bounds it), so a deadline made from it is early, and an age read
//! with it short, by as much. Outside a connection's poll (health checks, the sweeper)
//! [`coarse`] reads the clock every time. It is `std`'s clock: a test that pauses
//! tokio's clock would not move it.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

static EPOCH: OnceLock<(Instant, std::time::SystemTime)> = OnceLock::new();

fn epoch() -> &'static (Instant, std::time::SystemTime) {
    EPOCH.get_or_init(|| (Instant::now(), std::time::SystemTime::now()))
}

/// Milliseconds since the process started: a clock that fits in an atomic (from the
/// poll's reading, [`coarse`]).
pub(crate) fn now_ms() -> u64 {
    // Not `as_millis`: its u128 division costs more than reading the clock.
    let d = coarse().saturating_duration_since(epoch().0);
    d.as_secs() * 1000 + u64::from(d.subsec_millis()) + 1
}

/// Where this thread is: outside a [`OneReading`] poll, or inside one before or after
/// its reading.
#[derive(Clone, Copy)]
enum Turn {
    Outside,
    Unread,
    Read(Instant),
}

thread_local! {
    static TURN: Cell<Turn> = const { Cell::new(Turn::Outside) };
}

/// How long since `t`, by this poll's reading ([`coarse`]): short by up to a poll.
pub(crate) fn age(t: Instant) -> Duration {
    coarse().saturating_duration_since(t)
}

/// Now, as read once in this poll of a [`OneReading`] task (outside one: now). For
/// deadlines and ages; a latency an operator reads takes `Instant::now()`.
pub(crate) fn coarse() -> Instant {
    TURN.with(|turn| match turn.get() {
        Turn::Read(t) => t,
        Turn::Unread => {
            let t = Instant::now();
            turn.set(Turn::Read(t));
            t
        }
        Turn::Outside => Instant::now(),
    })
}

pin_project_lite::pin_project! {
    /// A task's future whose every poll shares one clock reading ([`coarse`]).
    pub(crate) struct OneReading<F> {
        #[pin]
        f: F,
    }
}

impl<F> OneReading<F> {
    pub(crate) fn new(f: F) -> OneReading<F> {
        OneReading { f }
    }
}

impl<F: Future> Future for OneReading<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Puts back what the thread was in when the poll ends, by a panic too (a
        /// reading left behind would be reused by the thread's other tasks).
        struct Restore(Turn);
        impl Drop for Restore {
            fn drop(&mut self) {
                TURN.with(|turn| turn.set(self.0));
            }
        }
        let _restore = Restore(TURN.with(|turn| turn.replace(Turn::Unread)));
        self.project().f.poll(cx)
    }
}

/// The wall-clock time of a [`now_ms`] reading, for an operator to read.
pub(crate) fn wall_clock(ms: u64) -> std::time::SystemTime {
    epoch().1 + Duration::from_millis(ms.saturating_sub(1))
}

/// Milliseconds since the Unix epoch, read from the wall clock now: for times other
/// parties wrote (a token's `exp`, a signed expiry), which [`wall_clock`]'s reading
/// at start would drift from over months.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `2026-12-01T09:30:00.123Z`: UTC, milliseconds.
pub(crate) fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_poll_shares_one_reading_and_the_next_poll_reads_again() {
        let (first, second) = OneReading::new(async {
            let a = coarse();
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(coarse(), a, "the same poll reuses its reading");
            tokio::task::yield_now().await;
            let b = coarse();
            (a, b)
        })
        .await;
        assert!(
            second >= first + Duration::from_millis(2),
            "a later poll reads the clock again"
        );
        // Outside a task's poll every call reads the clock.
        let a = coarse();
        std::thread::sleep(Duration::from_millis(2));
        assert!(coarse() >= a + Duration::from_millis(2));
    }

    #[test]
    fn a_panicking_poll_leaves_no_reading_behind() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(OneReading::new(async {
                let _ = coarse();
                panic!("on purpose");
            }))
        }));
        assert!(r.is_err());
        let a = coarse();
        std::thread::sleep(Duration::from_millis(2));
        assert!(coarse() >= a + Duration::from_millis(2), "back outside");
    }
}
