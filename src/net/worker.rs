//! Which worker thread the code runs on. `workers N` runs N threads, each with a
//! single-threaded runtime of its own (`server::workers`); a connection's sockets
//! belong to the worker that opened them. State a worker keeps for itself (a pool's
//! idle backend connections) is kept in one slot per worker, found by [`index`].

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many workers there are: set once at start, before the first generation is
/// compiled (its pools size their slots by it). 1 until then, and in unit tests.
static COUNT: AtomicUsize = AtomicUsize::new(1);

std::thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The number of workers (at least 1).
pub(crate) fn count() -> usize {
    COUNT.load(Ordering::Relaxed).max(1)
}

/// This thread's worker: 0..[`count`], and 0 on a thread that is no worker (the
/// blocking pool's, a test's).
pub(crate) fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Sets [`count`]; the server calls it once, before compiling its first generation.
pub(crate) fn set_count(n: usize) {
    COUNT.store(n.max(1), Ordering::Relaxed);
}

/// Marks the calling thread as worker `i`.
pub(crate) fn enter(i: usize) {
    INDEX.with(|c| c.set(i));
}
