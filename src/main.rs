//! The `sluice` command: run, check, demo, proxy, version. The command line only: the
//! server's life is `sluice::server::lifecycle`.

use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice::config::{self, Config};
use sluice::server::lifecycle;

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
            if !init_logging() {
                return ExitCode::from(1);
            }
            match load(&config) {
                Some(c) => lifecycle::serve(
                    c,
                    lifecycle::Source {
                        file: Some(config),
                        banner: None,
                    },
                ),
                None => ExitCode::from(1),
            }
        }
        Command::Proxy { from, to } => {
            if !init_logging() {
                return ExitCode::from(1);
            }
            let text = format!("listen {from}\nsite * {{\n    proxy {}\n}}\n", to.join(" "));
            match config::load_text("sluice proxy", &text) {
                Ok(l) => lifecycle::serve(l.config, lifecycle::Source::default()),
                Err(r) => {
                    eprintln!("{r}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Demo { listen } => {
            if !init_logging() {
                return ExitCode::from(1);
            }
            demo(&listen)
        }
    }
}

fn init_logging() -> bool {
    match sluice::admin::log::init() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("sluice: {e}");
            false
        }
    }
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

fn demo(listen: &str) -> ExitCode {
    let rt = match lifecycle::runtime(None) {
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
        Ok(l) => lifecycle::serve_on(
            rt,
            l.config,
            lifecycle::Source {
                file: None,
                banner: Some("sluice demo".into()),
            },
        ),
        Err(r) => {
            eprintln!("{r}");
            ExitCode::from(2)
        }
    }
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
