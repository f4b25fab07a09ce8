//! Configuration: text → syntax tree with spans (`lexer`, `parser`) → typed, validated
//! model (`build`, `model`). Loading is all or nothing: any error rejects the whole file,
//! and the caller keeps whatever it was running.

pub(crate) mod build;
pub(crate) mod certs;
pub mod diag;
pub(crate) mod lexer;
pub mod model;
pub(crate) mod parser;
pub mod template;
pub(crate) mod units;
pub(crate) mod validate;

pub use diag::{Diagnostic, Report, Severity, Sources};
pub use model::*;

use lexer::{Env, ProcessEnv};

/// A config that loaded, with the warnings it raised and the files it was read from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Report,
}

/// Loads `path` and everything it imports, with the process environment.
pub fn load_file(path: &str) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_file(path, sources, &ProcessEnv))
}

/// Loads config text that is not in a file (the demo, `sluice proxy`, tests).
pub fn load_text(name: &str, text: &str) -> Result<Loaded, Report> {
    load_text_env(name, text, &ProcessEnv)
}

pub fn load_text_env(name: &str, text: &str, env: &dyn Env) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_text(name, text, sources, env))
}

/// Loads config text without reading the files it imports (fuzzing: arbitrary text
/// must not name `/dev/zero`).
pub fn load_alone(name: &str, text: &str, env: &dyn Env) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_alone(name, text, sources, env))
}

fn load_with(
    parse: impl FnOnce(&mut Sources) -> Result<Vec<parser::Directive>, Diagnostic>,
) -> Result<Loaded, Report> {
    let mut sources = Sources::default();
    let tree = match parse(&mut sources) {
        Ok(t) => t,
        Err(d) => {
            return Err(Report {
                diagnostics: vec![d],
                sources,
            })
        }
    };
    match build::build(&tree, &sources) {
        Ok((config, warnings)) => Ok(Loaded {
            config,
            warnings: Report {
                diagnostics: warnings,
                sources,
            },
        }),
        Err(diagnostics) => Err(Report {
            diagnostics,
            sources,
        }),
    }
}
