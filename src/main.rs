//! The `sluice` command: run, check, demo, proxy, version.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice::config::{self, units::format_duration, Config};
use sluice::runtime::{Generation, Live};
use sluice::server::{self, drain::Drain};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A reverse proxy and application gateway: one binary, one config file."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run with a config file (logs go to stderr).
    Run {
        /// The config file.
        #[arg(short, long, default_value = "sluice.conf")]
        config: String,
    },
    /// Check a config file: print errors and warnings, and a summary when it loads.
    Check {
        /// The config file.
        #[arg(short, long, default_value = "sluice.conf")]
        config: String,
        /// Treat warnings as errors.
        #[arg(long)]
        strict: bool,
    },
    /// Run the embedded demo: two built-in backends behind one pool.
    Demo {
        /// Where the demo listens.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
    },
    /// A one-line reverse proxy with no config file.
    Proxy {
        /// The address to listen on, e.g. 127.0.0.1:8080 or :8080.
        #[arg(long)]
        from: String,
        /// Backend addresses (several after one --to, or --to repeated).
        #[arg(long, num_args = 1.., required = true)]
        to: Vec<String>,
    },
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("sluice {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Check { config, strict } => check(&config, strict),
        Command::Run { config } => {
            init_logging();
            match load(&config) {
                Some(c) => serve(c, None),
                None => ExitCode::from(1),
            }
        }
        Command::Proxy { from, to } => {
            init_logging();
            let text = format!("listen {from}\nsite * {{\n    proxy {}\n}}\n", to.join(" "));
            match config::load_text("sluice proxy", &text) {
                Ok(l) => serve(l.config, None),
                Err(r) => {
                    eprintln!("{r}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Demo { listen } => {
            init_logging();
            demo(&listen)
        }
    }
}

fn init_logging() {
    let level = match std::env::var("SLUICE_LOG").as_deref() {
        Ok("debug") => tracing::Level::DEBUG,
        Ok("trace") => tracing::Level::TRACE,
        Ok("warn") => tracing::Level::WARN,
        Ok("error") => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .without_time()
        .with_target(false)
        .with_level(false)
        .with_ansi(false)
        .init();
}

/// Loads a config file for `run`, printing what went wrong if it cannot.
fn load(path: &str) -> Option<Config> {
    if !Path::new(path).is_file() {
        eprintln!("sluice: cannot read config file {path}: no such file");
        return None;
    }
    match config::load_file(path) {
        Ok(l) => {
            for w in l.warnings.warnings() {
                eprintln!("{}", w.render(&l.warnings.sources));
            }
            Some(l.config)
        }
        Err(r) => {
            eprintln!("{r}");
            eprintln!(
                "sluice: {path}: config rejected ({} errors); nothing was started",
                r.errors().count()
            );
            None
        }
    }
}

fn check(path: &str, strict: bool) -> ExitCode {
    if !Path::new(path).is_file() {
        eprintln!("sluice check: cannot read config file {path}: no such file");
        return ExitCode::from(1);
    }
    match config::load_file(path) {
        Ok(l) => {
            let warnings: Vec<_> = l.warnings.warnings().collect();
            for w in &warnings {
                eprintln!("{}", w.render(&l.warnings.sources));
            }
            if strict && !warnings.is_empty() {
                eprintln!(
                    "sluice check: {path}: {} warnings, refused under --strict",
                    warnings.len()
                );
                return ExitCode::from(1);
            }
            println!("sluice check: {path}: ok: {}", l.config.summary());
            ExitCode::SUCCESS
        }
        Err(r) => {
            eprintln!("{r}");
            eprintln!("sluice check: {path}: {} errors", r.errors().count());
            ExitCode::from(1)
        }
    }
}

fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
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

fn demo(listen: &str) -> ExitCode {
    let rt = match runtime(None) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice demo: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let backends = match rt.block_on(sluice::demo::start_backends()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sluice demo: cannot start the demo backends: {e}");
            return ExitCode::from(1);
        }
    };
    let text = sluice::demo::config_text(listen, &backends);
    match config::load_text("sluice demo", &text) {
        Ok(l) => serve_on(rt, l.config, Some("sluice demo")),
        Err(r) => {
            eprintln!("{r}");
            ExitCode::from(2)
        }
    }
}

fn serve(config: Config, banner: Option<&str>) -> ExitCode {
    match runtime(config.global.workers) {
        Ok(rt) => serve_on(rt, config, banner),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

fn serve_on(rt: tokio::runtime::Runtime, config: Config, banner: Option<&str>) -> ExitCode {
    let code = rt.block_on(async move {
        let addrs: Vec<SocketAddr> = config.listeners.iter().map(|l| l.addr).collect();
        let listeners = match server::bind(&addrs).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::from(1);
            }
        };
        let live = Live::new(Generation::compile(&config));
        let drain = Drain::new();
        tracing::info!("sluice: loaded {}", config.summary());
        let mut accepting = Vec::new();
        for l in listeners {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!("sluice: listening on http://{addr}");
            if let Some(b) = banner {
                println!("{b}: listening on http://{addr}");
            }
            accepting.push(tokio::spawn(server::accept_loop(
                l,
                live.clone(),
                drain.clone(),
            )));
        }
        wait_for_stop().await;
        let grace = config.global.grace;
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
        if tokio::time::timeout(grace, drain.closed()).await.is_err() {
            tracing::warn!(
                "sluice: shutdown: cut {} requests still in flight after grace",
                drain.requests_in_flight()
            );
        }
        ExitCode::SUCCESS
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

async fn wait_for_stop() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
