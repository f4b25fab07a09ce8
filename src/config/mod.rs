//! Configuration: text → syntax tree with spans (`lexer`, `parser`) → typed, validated
//! model (`build`, `model`). Loading is all or nothing: any error rejects the whole file,
//! and the caller keeps whatever it was running.

pub(crate) mod build;
pub(crate) mod certs;
pub mod diag;
pub(crate) mod lexer;
pub mod model;
pub(crate) mod parser;
pub mod signed;
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
    /// The id of the key every file was verified with (`--verify-key`).
    pub signed_by: Option<String>,
    /// When each file was signed, by path (empty unless verified).
    pub signed_at: signed::SignedAt,
}

/// Loads `path` and everything it imports, with the process environment.
pub fn load_file(path: &str) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_file(path, sources, &ProcessEnv))
}

/// As [`load_file`]; with `key`, every file read must carry a valid signature
/// (`FILE.minisig`) by it, made no earlier than the same file's in `running` (the
/// running revision's), else the load fails with `FILE: signature: …`.
pub fn load_file_verified(
    path: &str,
    key: Option<&signed::VerifyKey>,
    running: &signed::SignedAt,
) -> Result<Loaded, Report> {
    verified(load_file(path), key, 0, running)
}

/// A rollback's text (checked when it was first loaded) with its imports re-read and,
/// with `key`, verified.
pub fn load_text_verified(
    name: &str,
    text: &str,
    key: Option<&signed::VerifyKey>,
) -> Result<Loaded, Report> {
    // A rollback is the operator's explicit way back: no file is judged by its age.
    verified(load_text(name, text), key, 1, &signed::SignedAt::new())
}

fn verified(
    loaded: Result<Loaded, Report>,
    key: Option<&signed::VerifyKey>,
    first: usize,
    running: &signed::SignedAt,
) -> Result<Loaded, Report> {
    let Some(key) = key else {
        return loaded;
    };
    let sources = match &loaded {
        Ok(l) => &l.warnings.sources,
        Err(r) => &r.sources,
    };
    let (errors, signed_at) = signed::verify(sources, key, first, running);
    match loaded {
        Ok(_) if !errors.is_empty() => Err(Report {
            diagnostics: errors,
            sources: sources.clone(),
        }),
        Ok(mut l) => {
            l.signed_by = Some(key.id().to_string());
            l.signed_at = signed_at;
            Ok(l)
        }
        // A file that does not load and is not signed either: the signature first.
        Err(mut r) => {
            let mut all = errors;
            all.append(&mut r.diagnostics);
            r.diagnostics = all;
            Err(r)
        }
    }
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
            signed_by: None,
            signed_at: signed::SignedAt::new(),
        }),
        Err(diagnostics) => Err(Report {
            diagnostics,
            sources,
        }),
    }
}
