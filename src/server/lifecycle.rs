//! The process's life: build the runtime, bind the listeners, compile the first
//! generation, accept; on SIGHUP reload; on SIGTERM/SIGINT stop accepting, let requests
//! in flight finish for up to `grace`, then exit 0. A second SIGTERM/SIGINT during the
//! drain exits at once; either way the requests cut are counted in the log.
//!
//! A reload is all or nothing: the file is read and checked, new listeners are bound,
//! and only then is the new generation swapped in; any failure leaves the running one
//! serving, untouched, and says why. Listeners the new config keeps are not touched,
//! added ones are bound, removed ones closed; connections are never cut by a reload.
//! Requests in flight finish on the generation they started with.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::drain::Drain;
use crate::config::units::format_duration;
use crate::config::{self, Config, Listen};
use crate::runtime::{Generation, Live};

/// A tokio runtime with `workers` threads (default: the machine's cores).
pub fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    // One worker needs no work stealing: the current-thread scheduler does the same
    // work with fewer atomics and no cross-thread wakeups.
    let mut b = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Some(n) = workers.filter(|n| *n > 1) {
        b.worker_threads(n);
    }
    b.enable_all().build()
}

/// Where the running config came from: the file a reload re-reads, if any.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub file: Option<String>,
    /// Printed on stdout with each listening address (the demo's banner).
    pub banner: Option<String>,
}

/// Runs `config` until stopped.
pub fn serve(config: Config, source: Source) -> ExitCode {
    match runtime(config.global.workers) {
        Ok(rt) => serve_on(rt, config, source),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

/// [`serve`] on a runtime the caller built (and may have started tasks on).
pub fn serve_on(rt: tokio::runtime::Runtime, config: Config, source: Source) -> ExitCode {
    let code = rt.block_on(async move {
        let bound = match bind_new(&config.listeners, &HashMap::new()) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::from(1);
            }
        };
        let mut server = Server {
            live: Live::new(Generation::compile(&config, None)),
            drain: Drain::new(),
            listeners: HashMap::new(),
            revision: 1,
            grace: config.global.grace,
            source,
        };
        tracing::info!("sluice: loaded revision 1: {}", config.summary());
        server.start(bound);
        let mut signals = Signals::new();
        while signals.next().await == Signal::Reload {
            server.reload();
        }
        server.stop(&mut signals).await;
        ExitCode::SUCCESS
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

/// A listener is the same listener across reloads when its address and family mode are.
type ListenKey = (SocketAddr, bool);

fn key(l: &Listen) -> ListenKey {
    (l.addr, l.dual_stack)
}

struct Accepting {
    close: Arc<Notify>,
    task: JoinHandle<()>,
}

struct Server {
    live: Arc<Live>,
    drain: Drain,
    listeners: HashMap<ListenKey, Accepting>,
    revision: u64,
    grace: Duration,
    source: Source,
}

/// Binds the listeners of `wanted` that are not running already; all or none.
fn bind_new(
    wanted: &[Listen],
    running: &HashMap<ListenKey, Accepting>,
) -> anyhow::Result<Vec<(ListenKey, TcpListener)>> {
    let fresh: Vec<Listen> = wanted
        .iter()
        .filter(|l| !running.contains_key(&key(l)))
        .cloned()
        .collect();
    let bound = super::bind(&fresh)?;
    Ok(fresh.iter().map(key).zip(bound).collect())
}

impl Server {
    fn start(&mut self, bound: Vec<(ListenKey, TcpListener)>) {
        for (k, l) in bound {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!("sluice: listening on http://{addr}");
            if let Some(b) = &self.source.banner {
                println!("{b}: listening on http://{addr}");
            }
            let close = Arc::new(Notify::new());
            let task = tokio::spawn(super::accept_loop(
                l,
                self.live.clone(),
                self.drain.clone(),
                close.clone(),
            ));
            self.listeners.insert(k, Accepting { close, task });
        }
    }

    /// Re-reads the config file and, if it loads, makes it the live generation.
    fn reload(&mut self) {
        let Some(file) = self.source.file.clone() else {
            tracing::warn!("sluice: reload: started without a config file, nothing to re-read");
            return;
        };
        let keep = self.revision;
        let loaded = match config::load_file(&file) {
            Ok(l) => l,
            Err(report) => {
                tracing::error!(
                    "sluice: reload rejected, still serving revision {keep}:\n{report}"
                );
                return;
            }
        };
        for w in loaded.warnings.warnings() {
            tracing::warn!("{}", w.render(&loaded.warnings.sources));
        }
        let config = loaded.config;
        let bound = match bind_new(&config.listeners, &self.listeners) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("sluice: reload rejected, still serving revision {keep}: {e}");
                return;
            }
        };
        let next = Generation::compile(&config, Some(&self.live.load()));
        self.live.swap(next);
        let wanted: Vec<ListenKey> = config.listeners.iter().map(key).collect();
        self.listeners.retain(|k, a| {
            let kept = wanted.contains(k);
            if !kept {
                tracing::info!("sluice: reload: no longer listening on {}", k.0);
                a.close.notify_one();
            }
            kept
        });
        self.start(bound);
        self.grace = config.global.grace;
        self.revision += 1;
        tracing::info!(
            "sluice: reloaded: revision {}: {}",
            self.revision,
            config.summary()
        );
    }

    /// Closes the listeners, then waits up to `grace` (or a second signal) for the
    /// requests in flight.
    async fn stop(self, signals: &mut Signals) {
        // Stop accepting first: once the accept loops return, the listeners are closed.
        self.drain.start();
        for (_, a) in self.listeners {
            let _ = a.task.await;
        }
        let drain = &self.drain;
        tracing::info!(
            "sluice: stopping: listeners closed; {} requests in flight get up to {} to finish",
            drain.requests_in_flight(),
            format_duration(self.grace)
        );
        let deadline = tokio::time::Instant::now() + self.grace;
        let why = loop {
            tokio::select! {
                r = tokio::time::timeout_at(deadline, drain.closed()) => match r {
                    Ok(()) => return,
                    Err(_) => break "after grace",
                },
                s = signals.next() => match s {
                    Signal::Stop => break "on a second signal",
                    // A reload asked for during the drain is moot.
                    Signal::Reload => continue,
                },
            }
        };
        tracing::warn!(
            "sluice: shutdown: cut {} requests still in flight {why}",
            drain.requests_in_flight()
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM or SIGINT.
    Stop,
    /// SIGHUP.
    Reload,
}

/// SIGTERM, SIGINT (Ctrl-C) and SIGHUP.
struct Signals {
    unix: Option<[tokio::signal::unix::Signal; 3]>,
}

impl Signals {
    fn new() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let unix = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(t), Ok(i), Ok(h)) => Some([t, i, h]),
            _ => None,
        };
        Signals { unix }
    }

    async fn next(&mut self) -> Signal {
        match &mut self.unix {
            Some([term, int, hup]) => {
                tokio::select! {
                    _ = term.recv() => Signal::Stop,
                    _ = int.recv() => Signal::Stop,
                    _ = hup.recv() => Signal::Reload,
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
                Signal::Stop
            }
        }
    }
}
