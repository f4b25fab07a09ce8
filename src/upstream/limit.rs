//! A pool's `limit N [wait D]`: at most N requests in flight, the same N across a
//! reload.
//!
//! The limit belongs to the pool's carried state, not to one generation: requests of
//! the old generation still hold their slots after a swap, so a fresh semaphore per
//! generation would let up to 2 × N through. A reload that changes N resizes the one
//! semaphore instead. Growing adds permits at once; shrinking forgets the free permits
//! it can and records the rest as a debt, paid by the next slots given back (they are
//! forgotten instead of returned), so "at most N" holds from the moment of the swap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The in-flight cap of one pool, shared by its generations.
pub(crate) struct Limit {
    sem: Arc<Semaphore>,
    /// The N the newest generation asked for.
    max: AtomicUsize,
    /// Permits still to forget as they come back (a reload lowered N while they were
    /// held).
    debt: AtomicUsize,
}

/// One request's place under a [`Limit`], given back when dropped.
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    limit: Arc<Limit>,
}

impl Limit {
    pub(crate) fn new(max: usize) -> Arc<Limit> {
        Arc::new(Limit {
            sem: Arc::new(Semaphore::new(max)),
            max: AtomicUsize::new(max),
            debt: AtomicUsize::new(0),
        })
    }

    /// The N of the newest generation.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Makes the cap `max` from now on (see the module).
    pub(crate) fn resize(&self, max: usize) {
        let old = self.max.swap(max, Ordering::AcqRel);
        if max > old {
            let grow = max - old;
            // A debt not yet paid is cancelled first: those permits still exist.
            let owed = self
                .debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                    Some(d - d.min(grow))
                })
                .unwrap_or(0);
            self.sem.add_permits(grow - owed.min(grow));
        } else if max < old {
            let cut = old - max;
            let forgotten = self.sem.forget_permits(cut);
            self.debt.fetch_add(cut - forgotten, Ordering::AcqRel);
            // A slot given back between the two lines above went to the semaphore, not
            // to the debt: pay with it now, so the lower cap holds at once.
            self.settle();
        }
    }

    /// Pays what it can of the debt with permits free now. A slot dropped meanwhile
    /// may pay too: what was forgotten beyond the debt is given back.
    fn settle(&self) {
        let owed = self.debt.load(Ordering::Acquire);
        if owed == 0 {
            return;
        }
        let forgotten = self.sem.forget_permits(owed);
        if forgotten == 0 {
            return;
        }
        let mut over = 0;
        let _ = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                over = forgotten.saturating_sub(d);
                Some(d.saturating_sub(forgotten))
            });
        if over > 0 {
            self.sem.add_permits(over);
        }
    }

    /// A free place, without waiting.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let permit = self.sem.clone().try_acquire_owned().ok()?;
        Some(self.slot(permit))
    }

    /// A place, waiting up to `wait` for one.
    pub(crate) async fn take(self: &Arc<Self>, wait: std::time::Duration) -> Option<Slot> {
        tokio::time::timeout(wait, self.acquire())
            .await
            .unwrap_or(None)
    }

    /// A place, once one is free.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Option<Slot> {
        let permit = self.sem.clone().acquire_owned().await.ok()?;
        Some(self.slot(permit))
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            permit: Some(permit),
            limit: self.clone(),
        }
    }

    /// Places taken now.
    pub(crate) fn in_use(&self) -> usize {
        let free = self.sem.available_permits();
        (self.max() + self.debt.load(Ordering::Acquire)).saturating_sub(free)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let owed = self
            .limit
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1));
        if owed.is_ok() {
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_while_held_waits_for_slots_to_come_back() {
        let l = Limit::new(4);
        let held: Vec<Slot> = (0..4).map(|_| l.try_take().unwrap()).collect();
        l.resize(2);
        assert!(l.try_take().is_none());
        let mut held = held.into_iter();
        drop(held.next());
        drop(held.next());
        assert!(
            l.try_take().is_none(),
            "two still held: the cap of 2 is full"
        );
        drop(held.next());
        let one = l.try_take().expect("one of 2 held");
        assert!(l.try_take().is_none());
        drop(one);
        drop(held);
        let a = l.try_take().unwrap();
        let b = l.try_take().unwrap();
        assert!(l.try_take().is_none(), "exactly 2 once all came back");
        drop((a, b));
    }

    #[test]
    fn growing_cancels_a_debt_before_adding() {
        let l = Limit::new(3);
        let held: Vec<Slot> = (0..3).map(|_| l.try_take().unwrap()).collect();
        l.resize(1);
        l.resize(5);
        let more: Vec<Slot> = (0..2).map(|_| l.try_take().unwrap()).collect();
        assert!(l.try_take().is_none(), "3 held + 2 = 5");
        drop(held);
        drop(more);
        let all: Vec<Slot> = (0..5).map(|_| l.try_take().unwrap()).collect();
        assert!(l.try_take().is_none());
        assert_eq!(l.in_use(), 5);
        drop(all);
        assert_eq!(l.in_use(), 0);
    }

    proptest::proptest! {
        /// Any sequence of takes, gives and resizes: never more places held than the
        /// newest cap allows once the debt is paid, and never fewer available than it.
        #[test]
        fn the_cap_holds_under_any_resizes(ops in proptest::collection::vec((0u8..3, 0usize..6), 1..60)) {
            let l = Limit::new(3);
            let mut held = Vec::new();
            for (op, n) in ops {
                match op {
                    0 => if let Some(s) = l.try_take() { held.push(s) },
                    1 => { if !held.is_empty() { held.remove(n % held.len()); } }
                    _ => l.resize(n),
                }
                let max = l.max();
                if let Some(s) = l.try_take() {
                    proptest::prop_assert!(held.len() < max, "{} held, cap {max}, took one more", held.len());
                    drop(s);
                } else {
                    proptest::prop_assert!(held.len() >= max, "{} held, cap {max}, refused", held.len());
                }
            }
        }
    }
}
