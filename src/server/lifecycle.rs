//! The process's life: build the runtime, bind the listeners, compile the first
//! generation, accept; on SIGTERM/SIGINT stop accepting, let requests in flight finish
//! for up to `grace`, then exit 0. A second SIGTERM/SIGINT during the drain exits at
//! once; either way the requests cut are counted in the log.

use std::process::ExitCode;
use std::time::Duration;

use super::drain::Drain;
use crate::config::units::format_duration;
use crate::config::Config;
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

/// Runs `config` until stopped. `banner` (the demo's) is printed on stdout with each
/// listening address.
pub fn serve(config: Config, banner: Option<&str>) -> ExitCode {
    match runtime(config.global.workers) {
        Ok(rt) => serve_on(rt, config, banner),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

/// [`serve`] on a runtime the caller built (and may have started tasks on).
pub fn serve_on(rt: tokio::runtime::Runtime, config: Config, banner: Option<&str>) -> ExitCode {
    let code = rt.block_on(async move {
        let listeners = match super::bind(&config.listeners) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::from(1);
            }
        };
        let live = Live::new(Generation::compile(&config, None));
        let drain = Drain::new();
        tracing::info!("sluice: loaded {}", config.summary());
        let mut accepting = Vec::new();
        for l in listeners {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!("sluice: listening on http://{addr}");
            if let Some(b) = banner {
                println!("{b}: listening on http://{addr}");
            }
            accepting.push(tokio::spawn(super::accept_loop(
                l,
                live.clone(),
                drain.clone(),
            )));
        }
        let mut signals = Signals::new();
        signals.next().await;
        stop(&drain, accepting, config.global.grace, &mut signals).await;
        ExitCode::SUCCESS
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Closes the listeners, then waits up to `grace` (or a second signal) for the
/// requests in flight.
async fn stop(
    drain: &Drain,
    accepting: Vec<tokio::task::JoinHandle<()>>,
    grace: Duration,
    signals: &mut Signals,
) {
    // Stop accepting first: once the accept loops return, the listeners are closed.
    drain.start();
    for a in accepting {
        let _ = a.await;
    }
    tracing::info!(
        "sluice: stopping: listeners closed; {} requests in flight get up to {} to finish",
        drain.requests_in_flight(),
        format_duration(grace)
    );
    let why = tokio::select! {
        r = tokio::time::timeout(grace, drain.closed()) => match r {
            Ok(()) => return,
            Err(_) => "after grace",
        },
        _ = signals.next() => "on a second signal",
    };
    tracing::warn!(
        "sluice: shutdown: cut {} requests still in flight {why}",
        drain.requests_in_flight()
    );
}

/// SIGTERM and SIGINT (Ctrl-C).
struct Signals {
    unix: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn new() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let unix = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => Some((t, i)),
            _ => None,
        };
        Signals { unix }
    }

    async fn next(&mut self) {
        match &mut self.unix {
            Some((term, int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
