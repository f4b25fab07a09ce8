//! `workers N`: N threads, each running a single-threaded runtime of its own, as nginx
//! runs N worker processes. Every worker accepts on every TCP listener (a duplicate of
//! the socket, registered with the worker's own poller), and a connection stays on the
//! worker that accepted it: its reads, writes, timers and tasks never move to another
//! thread, and nothing is woken across threads on its behalf. A worker that is busy
//! leaves new connections to the others, which are waiting in their pollers.
//!
//! This replaced tokio's work-stealing scheduler, whose worker threads share one
//! poller and move tasks between them: on this project's benchmark machine it cost
//! more CPU a request than one thread, so `workers 2` lost to `workers 1`
//! (docs/performance.md, "ninth part").
//!
//! The main thread is worker 0: it also runs what is not a connection (signals,
//! reloads, the admin API, health probes, QUIC). The others start with the server and
//! end when it does.

use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::net::worker;

/// The worker threads besides the main one, and a handle to every worker's runtime.
pub(crate) struct Workers {
    /// Worker 0 (the main thread's runtime) first.
    handles: Vec<Handle>,
    threads: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Workers {
    /// Starts workers 1..`n`; the calling thread, inside its runtime, is worker 0. A
    /// worker that cannot start is logged, and the others serve without it.
    pub(crate) fn start(n: usize) -> Workers {
        worker::enter(0);
        let mut workers = Workers {
            handles: vec![Handle::current()],
            threads: Vec::new(),
        };
        for i in 1..n {
            match spawn(i) {
                Ok((handle, stop, thread)) => {
                    workers.handles.push(handle);
                    workers.threads.push((stop, thread));
                }
                Err(e) => tracing::error!(
                    "sluice: cannot start worker {i} of {n}: {e}; serving with the others"
                ),
            }
        }
        workers
    }

    /// Every worker's runtime, worker 0's first.
    pub(crate) fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

/// Worker `i`'s thread and runtime: it runs until told to stop.
fn spawn(i: usize) -> std::io::Result<(Handle, oneshot::Sender<()>, JoinHandle<()>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("sluice-worker-{i}"))
        .spawn(move || {
            worker::enter(i);
            let _ = rt.block_on(stopped);
            rt.shutdown_timeout(std::time::Duration::from_millis(100));
        })?;
    Ok((handle, stop, thread))
}

impl Drop for Workers {
    /// Stops the other workers (what they still run is cut, as the main runtime's is
    /// when it ends) and waits for their threads.
    fn drop(&mut self) {
        let threads: Vec<JoinHandle<()>> = self
            .threads
            .drain(..)
            .map(|(stop, thread)| {
                let _ = stop.send(());
                thread
            })
            .collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}
