//! A connection's work beside what may end it early (shutdown, an idle timeout, a
//! stalled stream). `tokio::select!` polls every branch on every wake-up of the task;
//! for an HTTP/2 connection that is each frame read and each backend answer, and the
//! branches that almost never fire cost ~1,900 instructions a request between them
//! (a `Notified`, a `Sleep` and the stall sweeper's own `Notified`). [`Beside`] polls
//! the work on every wake-up and the other future only when its own waker fired.
//!
//! Written here, not taken from a crate: `futures_util`'s `select` and tokio's macro
//! both poll every side on every wake-up; `FuturesUnordered` keeps a waker a future
//! but needs one output type and a task allocation a future.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

pin_project_lite::pin_project! {
    /// `work` and `side` raced: `work` is polled on every wake-up, `side` on the first
    /// poll and then only after it asked to be (its waker fired).
    pub(crate) struct Beside<W, S> {
        #[pin]
        work: W,
        #[pin]
        side: S,
        flag: Arc<Flag>,
        waker: Waker,
    }
}

/// Which of the two ended the race.
pub(crate) enum Ended<A, B> {
    Work(A),
    Side(B),
}

/// The side's waker: notes that the side wants a poll and wakes the task.
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

pub(crate) fn beside<W: Future, S: Future>(work: W, side: S) -> Beside<W, S> {
    let flag = Arc::new(Flag {
        // The side is polled once at first, to register its waker.
        woken: AtomicBool::new(true),
        task: AtomicWaker::new(),
    });
    Beside {
        work,
        side,
        waker: Waker::from(flag.clone()),
        flag,
    }
}

impl<W: Future, S: Future> Future for Beside<W, S> {
    type Output = Ended<W::Output, S::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Registered before the flag is read: a wake between the two is not lost.
        this.flag.task.register(cx.waker());
        if this.flag.woken.swap(false, Ordering::AcqRel) {
            let mut side_cx = Context::from_waker(this.waker);
            if let Poll::Ready(v) = this.side.poll(&mut side_cx) {
                return Poll::Ready(Ended::Side(v));
            }
        }
        this.work.poll(cx).map(Ended::Work)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    use super::*;

    /// A future that counts its polls and never ends.
    fn counted(polls: Arc<AtomicU32>) -> impl Future<Output = ()> {
        std::future::poll_fn(move |_| {
            polls.fetch_add(1, Ordering::Relaxed);
            Poll::Pending
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_side_is_polled_only_when_its_waker_fires() {
        let polls = Arc::new(AtomicU32::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<u32>();
        let side = {
            let polls = polls.clone();
            async move {
                tokio::select! {
                    v = end_rx => v.unwrap_or(0),
                    _ = counted(polls) => unreachable!(),
                }
            }
        };
        let work = async move {
            let mut sum = 0;
            while let Some(n) = rx.recv().await {
                sum += n;
            }
            sum
        };
        let race = tokio::spawn(async move {
            match beside(work, side).await {
                Ended::Work(sum) => Err(sum),
                Ended::Side(v) => Ok(v),
            }
        });
        for n in 1..=100 {
            tx.send(n).unwrap();
            tokio::task::yield_now().await;
        }
        // The work woke 100 times; the side was polled once, to begin.
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "the side was polled on the work's wake-ups"
        );
        // The side's own waker fires and its answer ends the race.
        end_tx.send(9).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(5), race)
            .await
            .expect("the side ended the race")
            .unwrap();
        assert_eq!(ended, Ok(9));
        drop(tx);
    }

    /// A side woken from another thread while the work keeps the task busy still
    /// ends the race.
    #[tokio::test(flavor = "current_thread")]
    async fn a_side_woken_from_another_thread_is_polled() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let work = async {
            loop {
                tokio::task::yield_now().await;
            }
        };
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(3).unwrap();
        });
        let ended = tokio::time::timeout(Duration::from_secs(5), beside(work, rx))
            .await
            .expect("the side's wake from another thread was seen");
        assert!(matches!(ended, Ended::Side(Ok(3))));
        sender.join().unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_work_ends_the_race() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let race = tokio::spawn(beside(rx, std::future::pending::<()>()));
        tx.send(7).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(5), race)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(ended, Ended::Work(Ok(7))));
    }
}
